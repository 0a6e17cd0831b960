"""Jobs that share one link: fair sharing, unfair sharing (MLTCP) and time shifting (CASSINI), seed 003.

Each job repeats an iteration: a compute phase of `compute_s`, then `comm_s` of traffic (the seconds its
all-reduce takes alone on the link). While several jobs communicate they split the link by weight (fair:
equal weights; unfair: the weights given, as MLTCP's favoured job gets more), a job alone takes the whole
link. A fluid model, event by event: the next event is the first compute phase or transfer to end.
`iterations` of each job are run; a job's iteration time is the mean over its second half (the steady
state the shares settle into).

The seed's table (Ghobadi's slides, "Unfairness doesn't always help") gives, per group of jobs, each
job's speed-up from unfair sharing; `PAIRS` holds those groups and figures, `job()` our profile of each
model (the compute phase from its forward FLOPs relative to VGG16's measured profile,
the traffic from its parameters, where our profiles do not have it).
"""
from __future__ import annotations

from dataclasses import dataclass

from profiles import WORKLOADS, compute_seconds
from simulator.model.detail import COMPUTE, TRANSFER, Detail
from simulator.model.interference import Interference
from simulator.model.rings import alone_rate, latency_of


@dataclass(frozen=True)
class Job:
    name: str
    compute_s: float
    comm_s: float  # seconds of traffic alone on the link per iteration


def run(jobs: list[Job], weights: list[float], offsets: list[float] | None = None,
        iterations: int = 200) -> list[float]:
    """Each job's steady iteration time on one shared link."""
    n = len(jobs)
    offsets = offsets or [0.0] * n
    t = 0.0
    # phase: 0 waiting its offset, 1 computing, 2 communicating; left: seconds (0, 1) or traffic-seconds (2)
    phase = [0 if o > 0 else 1 for o in offsets]
    left = [o if o > 0 else j.compute_s for o, j in zip(offsets, jobs, strict=True)]
    ends: list[list[float]] = [[] for _ in jobs]
    while min(len(e) for e in ends) < iterations:
        talking = [i for i in range(n) if phase[i] == 2]
        total = sum(weights[i] for i in talking)
        rate = {i: weights[i] / total for i in talking}
        dt = min(left[i] / rate[i] if phase[i] == 2 else left[i] for i in range(n))
        t += dt
        for i in range(n):
            left[i] -= dt * rate[i] if phase[i] == 2 else dt
            if left[i] > 1e-12:
                continue
            if phase[i] == 2:
                ends[i].append(t)
            phase[i] = 2 if phase[i] == 1 else 1
            left[i] = jobs[i].comm_s if phase[i] == 2 else jobs[i].compute_s
    out = []
    for e in ends:
        half = e[iterations // 2:iterations]
        out.append((half[-1] - half[0]) / (len(half) - 1))
    return out


def best_offsets(jobs: list[Job], grid: int = 24, iterations: int = 120) -> tuple[list[float], list[float]]:
    """CASSINI-style: the start delays of jobs 2.. (on a grid over each one's iteration alone) that give the
    least mean iteration time under fair sharing; (offsets, iteration times). No delay unless one does better."""
    best_off = [0.0] * len(jobs)
    best = run(jobs, [1.0] * len(jobs), best_off, iterations)
    for i in range(1, len(jobs)):
        period = jobs[i].compute_s + jobs[i].comm_s
        for k in range(1, grid):
            off = list(best_off)
            off[i] = period * k / grid
            times = run(jobs, [1.0] * len(jobs), off, iterations)
            if sum(times) < sum(best) * (1 - 1e-6):
                best, cand = times, off
                best_off = cand
    return best_off, best


def why_no_gain(jobs: list[Job], fair: list[float], shifted: list[float]) -> str:
    """Why time shifting saved nothing (under 1 % for every job), or '' where it saved something."""
    if any(f / s > 1.01 for f, s in zip(fair, shifted, strict=True)):
        return ""
    periods = [j.compute_s + j.comm_s for j in jobs]
    if max(periods) > min(periods) * 1.01:
        return (f"their iterations alone differ ({', '.join(f'{p:.3g}' for p in periods)} s), so a shifted start "
                "drifts back into overlap; fair shares do not hold an interleaving, only unequal ones do")
    comm = sum(j.comm_s for j in jobs)
    if comm >= max(periods):
        return (f"the link is busy all the time ({comm:.3g} s of traffic per {max(periods):.3g} s iteration): "
                "there is no pause to shift into")
    return "they did not overlap even unshifted"


# forward GFLOPs per sample (224x224 images; BERT-base at 128 tokens) and parameters: published figures
MODELS = {"VGG11": (7.6, 132_863_336), "VGG16": (15.5, 138_357_544), "VGG19": (19.6, 143_667_240),
          "ResNet50": (4.1, 25_557_032), "BERT": (22.5, 110_000_000), "DLRM": (None, None)}
# the seed's table: the jobs of each group and their speed-ups from unfair sharing, and "compatible"
PAIRS = [(("VGG11", "VGG11"), (1.05, 0.86), False), (("DLRM", "DLRM"), (1.3, 1.28), True),
         (("BERT", "VGG19"), (1.17, 0.94), False), (("VGG19", "VGG16", "ResNet50"), (1.18, 1.18, 1.01), True)]
UNFAIR = {2: [0.6, 0.4], 3: [0.5, 0.3, 0.2]}  # the slides' 60/40 split; for three jobs: assumed


def job(model: str, gpu: str = "V100", gbps: float = 100.0, ranks: int = 8, efficiency: float = 0.95) -> Job:
    """Our profile of `model`: VGG16's measured compute scaled by forward FLOPs; ring all-reduce of fp32
    gradients over `ranks` on a link of `gbps`. DLRM (not profiled, embedding-bound): its traffic assumed
    equal to its compute phase, VGG16's."""
    base = compute_seconds("vgg16", gpu)
    rate = gbps * 1e9 / 8 * efficiency
    flops, params = MODELS[model]
    if flops is None:
        comm = 2 * (ranks - 1) / ranks * WORKLOADS["vgg16"].gradient_bytes / rate
        return Job(model, comm, comm)
    return Job(model, base * flops / MODELS["VGG16"][0], 2 * (ranks - 1) / ranks * params * 4 / rate)


def table(iterations: int = 200) -> list[dict]:
    """Every group of the seed's table: fair, unfair and shifted iteration times, speed-ups against fair."""
    rows = []
    for names, paper, compatible in PAIRS:
        jobs = [job(m) for m in names]
        fair = run(jobs, [1.0] * len(jobs), iterations=iterations)
        unfair = run(jobs, UNFAIR[len(jobs)], iterations=iterations)
        offsets, shifted = best_offsets(jobs)
        rows.append({"jobs": list(names), "paper_speedup": list(paper), "paper_compatible": compatible,
                     "compute_s": [j.compute_s for j in jobs], "comm_s": [j.comm_s for j in jobs],
                     "fair_s": fair, "unfair_s": unfair, "weights": UNFAIR[len(jobs)],
                     "unfair_speedup": [f / u for f, u in zip(fair, unfair, strict=True)],
                     "shift_offsets_s": offsets, "shifted_s": shifted,
                     "shift_speedup": [f / s for f, s in zip(fair, shifted, strict=True)],
                     "compatible": all(f / u >= 1 - 1e-9 for f, u in zip(fair, unfair, strict=True)),
                     "why_no_shift_gain": why_no_gain(jobs, fair, shifted)})
    return rows


# --- MLTCP in the cluster engine (the policy `mltcp` of optirack simulate, simulator/model/neighbours.py)
# --------------
# MLTCP scales a flow's aggressiveness by the share of its iteration's bytes it has sent, so the job further into
# its all-reduce takes more of a shared link, finishes first and computes while the other sends: jobs that share
# drift into interleaving. Here: while several rings transfer on a link, ring j's rate is weighted max-min with
# weight 1 + slope x (its iteration's bytes sent, as a share), the share taken in `levels` steps (a staircase, so
# the rates change only at events: a ring crossing a level is one). The engine's model files (simulator/model/detail.py,
# simulator/model/interference.py) are used as they are: these subclasses only weigh the shares.
def weighted_max_min(weights: dict[int, float], caps: dict[int, float], uses: dict[int, dict[int, int]],
                     capacity) -> dict[int, float]:
    """Progressive filling in proportion to `weights`: every unfrozen ring j moves at weights[j] x level, capped by
    caps[j]; a link full (its flows x rates at its capacity) freezes its rings."""
    rates: dict[int, float] = {}
    remaining = {link: capacity[link] for j in uses for link in uses[j]}
    active = set(caps)
    while active:
        demand: dict[int, float] = {}
        for j in active:
            for link, flows in uses.get(j, {}).items():
                demand[link] = demand.get(link, 0.0) + flows * weights[j]
        level, tight = min(caps[j] / weights[j] for j in active), None
        for link, d in demand.items():
            if remaining[link] / d < level:
                level, tight = remaining[link] / d, link
        frozen = {j for j in active if caps[j] / weights[j] <= level * (1 + 1e-12)} if tight is None else \
            {j for j in active if tight in uses.get(j, {})}
        for j in frozen:
            rates[j] = weights[j] * level
            for link, flows in uses.get(j, {}).items():
                remaining[link] = max(0.0, remaining[link] - flows * rates[j])
        active -= frozen
    return rates


class MltcpDetail(Detail):
    """simulator/model/detail.py's rings on shared links, the transferring rings weighted by the bytes they have
    sent."""

    def __init__(self, *args, slope: float, levels: int, **kw):
        super().__init__(*args, **kw)
        self.slope, self.levels = slope, levels
        self._crossing: set[int] = set()  # rings whose next event is a level crossed, not the end of a phase

    def sent(self, key: int) -> float:
        """The share of its iteration's bytes the ring has sent (0 before its all-reduce)."""
        s, ring = self.states[key], self.rings[key]
        if s.phase != TRANSFER or not ring.steps:
            return 0.0 if s.phase == COMPUTE else (s.step + 1) / ring.steps
        if ring.coarse:
            return 1 - s.remaining / ring.steps
        return (s.step + 1 - s.remaining / ring.step_bytes) / ring.steps

    def level(self, key: int) -> int:
        return min(self.levels - 1, int(self.sent(key) * self.levels + 1e-9))

    def weight(self, key: int) -> float:
        return 1 + self.slope * self.level(key) / self.levels

    def _rates(self) -> dict[int, float]:
        if self._stale:
            moving = tuple(k for k, s in self.states.items() if s.phase == TRANSFER)
            levels = tuple(self.level(k) for k in moving)
            tags = ("mltcp", *((self._tags[k], lv) for k, lv in zip(moving, levels, strict=True)))
            rates = self._known.get(tags)
            if rates is None:
                rates = self._known[tags] = weighted_max_min(
                    {k: self.weight(k) for k in moving}, {k: self.rings[k].cap for k in moving},
                    {k: self.rings[k].links for k in moving}, self.capacity)
            self.rates = rates
            self._stale = False
        return self.rates

    def _time_left(self, key: int) -> float:
        left = super()._time_left(key)
        self._crossing.discard(key)
        s, ring = self.states[key], self.rings[key]
        lv = self.level(key)
        if s.phase != TRANSFER or lv + 1 >= self.levels:
            return left
        to_go = (lv + 1) / self.levels * ring.steps - self.sent(key) * ring.steps  # steps to the next level
        rate = self._rates()[key]
        if ring.coarse:
            dt = to_go * (ring.step_bytes / rate + latency_of(ring, self.latency))
        else:
            dt = to_go * ring.step_bytes / rate
        if dt < left * (1 - 1e-9):
            self._crossing.add(key)
            return dt
        return left

    def _transition(self, key: int, t: float) -> bool:
        if key in self._crossing:  # a level crossed: the shares change, the phase goes on
            self._crossing.discard(key)
            self._stale = True
            return False
        return super()._transition(key, t)


class MltcpInterference(Interference):
    """simulator/model/interference.py with MLTCP's shares where a component is stepped through. A component too large
    for that (mean field) keeps fair shares. `why` notes, for each ring stepped through on a link whose summed peak
    demand exceeded it (where unequal shares can matter), what bounds an interleaving there: "busy" (the link's
    traffic, every ring at its pace alone, fills more than all its time: no pause to interleave into), "periods"
    (their iterations alone differ, so no interleaving holds), else "other"; `mean` holds the rings of components
    solved by mean field."""

    def __init__(self, base: Interference, slope: float, levels: int):
        super().__init__(base.capacity, base.latency, base.limits, base.force, base.held)
        self.slope, self.levels = slope, levels
        self.mean: set[int] = set()
        self.why: dict[int, str] = {}

    def _solve(self, t, keys, pending) -> None:
        super()._solve(t, keys, pending)
        if len(keys) < 2:
            return
        if getattr(self.comp[keys[0]], "mode", "mean") != "detail":  # a Block (arrays) is mean field
            self.mean.update(keys)
            return
        demand, load, alone = {}, {}, {k: self.period_alone(self.rings[k]) for k in keys}
        for k in keys:
            ring = self.rings[k]
            duty = 1 - ring.compute_s / alone[k]  # the share of its iteration alone spent communicating
            for link, flows in ring.links.items():
                d = flows * alone_rate(ring, self.capacity)
                demand[link] = demand.get(link, 0.0) + d
                load[link] = load.get(link, 0.0) + d / self.capacity[link] * duty
        over = {link for link, d in demand.items() if d > self.capacity[link] * (1 + 1e-9)}
        for k in keys:
            mine = over & set(self.rings[k].links)
            if not mine:
                continue
            peers = [alone[j] for j in keys if mine & set(self.rings[j].links)]
            self.why[k] = "busy" if any(load[link] >= 1 - 1e-9 for link in mine) else \
                "periods" if max(peers) > min(peers) * 1.01 else "other"

    def _detail(self, comp) -> Detail:
        if len(self._known) > 20_000:
            self._known.clear()
        return MltcpDetail([self.rings[k] for k in comp.keys], self.capacity, self.latency,
                           {k: s.copy() for k, s in comp.start.items()}, self.held, (self._known, self._tags),
                           slope=self.slope, levels=self.levels)

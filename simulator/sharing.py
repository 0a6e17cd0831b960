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

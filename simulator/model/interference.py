"""Running rings grouped by the links they share, and each ring's progress over time.

A ring alone on its links advances at its closed-form iteration time. Rings that share a link
form a component, solved one of two ways: stepped through in detail (simulator/model/detail.py) for
a window of iterations, after which they go on at the iteration times measured in the window's
second half; or, when the component is too large to step through, by the mean-field fixed point
(simulator/model/meanfield.py). A component is solved again whenever a ring joins or leaves it; a large
mean-field component is settled and solved as arrays (simulator/model/columns.py: the same floats as
ring by ring), and only a component that lost a ring is searched for its parts again.
With held shares (`held`: the network's sharing "held") both ways apply it: stepped through, the
detail holds every ring's rate; too large, the component takes its exact closed form (the rates
are the max-min shares of all its rings, constant while it lasts), not the mean field, whose
duty cycles only matter where idle capacity is handed over.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from simulator.model.busy import Busy
from simulator.model.columns import ALMOST_ONE, Block, Columns, elapsed_of, state_of
from simulator.model.detail import Detail, RingState
from simulator.model.maxmin import max_min
from simulator.model.rings import Ring, alone_rate, iteration_time, latency_of

_COLUMNS = object()  # a held state kept in Interference.cols, not as a RingState


@dataclass(frozen=True)
class Limits:
    """When a component is stepped through in detail, and for how long."""

    rings: int = 16  # at most this many rings
    round_events: int = 512  # and at most this many events while each of its rings does one iteration
    window: int = 30  # iterations of each ring stepped through before it goes on at the measured pace
    events: int = 200_000  # and at most this many events per solve


@dataclass
class _Fluid:
    t: float
    done: float  # iterations, fractional
    period: float


@dataclass
class _Comp:
    keys: list[int]
    mode: str  # alone | detail | mean
    t0: float
    start: dict[int, RingState]  # states at t0
    p0: dict[int, float]  # progress at t0
    horizon: float = -math.inf  # detail: stepped through until here, fluid after
    fluid: dict[int, _Fluid] = field(default_factory=dict)

    def at(self, key: int) -> tuple[float, float, float]:
        f = self.fluid[key]
        return f.t, f.done, f.period


class Interference:
    """Rings on the fabric: add and remove them at times that never go back; ask when they finish."""

    VECTOR_MIN = 8  # a mean-field component of at least this many rings is settled and solved as arrays

    def __init__(self, capacity: list[float], latency: float, limits: Limits = Limits(), force: str | None = None,
                 held: bool = False):
        self.capacity, self.latency, self.limits, self.force = capacity, latency, limits, force
        self.held = held  # shares held through compute phases and gaps (simulator/model/detail.py), in every mode
        self.rings: dict[int, Ring] = {}
        self.targets: dict[int, int] = {}
        self.comp: dict[int, _Comp | Block] = {}
        self.users: dict[int, set[int]] = {}  # link -> rings
        self.finish: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []
        self.busy = Busy()  # GPU-seconds computed between solves
        self.stats = {"alone": 0, "detail": 0, "mean": 0, "events": 0}
        self.shared: set[int] = set()  # rings that ever shared a link with another
        self.cols = Columns()  # per-ring columns: the mean-field duty cycles (the next solve starts from them), ...
        self._inverse = 1.0 / np.asarray(capacity, dtype=float)
        # rings settled at _pending_t, not yet solved: state (or _COLUMNS: kept in cols) and progress
        self._pending: dict[int, tuple[object, float | None]] = {}
        self._pending_t = 0.0
        # the pending rings by where they came from: whole components settled (pieces), rings added; a piece that
        # lost a ring may have come apart, the others are connected, and only a ring added joins pieces
        self._pieces: list[list[int]] = []
        self._piece_of: dict[int, int] = {}
        # the pieces that lost a ring: the rings they lost, and the links those crossed
        self._broken: dict[int, tuple[list[int], list[int]]] = {}
        # stepping through: the max-min rates of each set of transferring rings met, by the rings' tags (a ring put on
        # the fabric again is another ring: a new tag)
        self._known: dict[tuple[int, ...], dict[int, float]] = {}
        self._tags: dict[int, int] = {}
        self._tagged = 0

    # --- what the engine calls ---------------------------------------------------------
    def add(self, t: float, ring: Ring, iterations: int, state: RingState | None = None) -> None:
        """Put a ring on the fabric at `t` (from `state`, or the start of its first iteration)."""
        self._take(t, {k for link in ring.links for k in self.users.get(link, ())})
        self.rings[ring.key], self.targets[ring.key] = ring, iterations
        self.cols.set_ring(ring, iterations, self._lat(ring))
        self._tagged += 1
        self._tags[ring.key] = self._tagged
        for link in ring.links:
            self.users.setdefault(link, set()).add(ring.key)
        self._pending[ring.key] = (state.copy() if state else RingState(remaining=ring.compute_s), None)
        self._piece_of[ring.key] = len(self._pieces)
        self._pieces.append([ring.key])

    def remove(self, t: float, key: int) -> tuple[RingState, float]:
        """Take a ring off the fabric (it finished, or stalls to move); return its state and progress."""
        self._take(t, {key})
        state, progress = self._pending.pop(key)
        if state is _COLUMNS:
            state, progress = self.cols.get(key)
        lost, cut = self._broken.setdefault(self._piece_of.pop(key), ([], []))
        lost.append(key)
        cut.extend(self.rings[key].links)
        if progress is None:  # it joined at this very instant
            progress = state.done + self._fraction(state, self.rings[key], self.period_alone(self.rings[key]))
        for link in self.rings[key].links:
            self.users[link].discard(key)
        del self.rings[key], self.targets[key], self._tags[key]
        self.comp.pop(key, None)  # its component's entry, left by `_settle`
        self.cols.drop(key)
        self.finish.pop(key, None)
        return state, progress

    def _take(self, t: float, keys: set[int]) -> None:
        """Settle the components of `keys` at `t` and hold them unsolved: several changes at one
        instant (a job ends, the next starts) are solved once."""
        if self._pending and t != self._pending_t:
            self._flush()
        pending = self._pending
        for k in {k for k in keys if k not in pending}:  # each component once, by its first ring met
            if k not in pending:  # (settled, its rings are pending)
                self._settle(t, self.comp[k])
        self._pending_t = t

    def _flush(self) -> None:
        """Solve the components of the rings held by `_take`."""
        if not self._pending:
            return
        pending, pieces, piece_of, broken = self._pending, self._pieces, self._piece_of, self._broken
        self._pending, self._pieces, self._piece_of, self._broken = {}, [], {}, {}
        parent = list(range(len(pieces)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        # a ring added joins the pieces whose rings share its links (each such piece once: a set's root is its least
        # piece whatever the order of the joins)
        for i, piece in enumerate(pieces):
            if len(piece) == 1 and piece[0] in pending and pending[piece[0]][1] is None:
                for j in {piece_of[k] for link in self.rings[piece[0]].links for k in self.users[link]}:
                    a, b = root(i), root(j)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
        joined: dict[int, list[int]] = {}
        for i in range(len(pieces)):
            joined.setdefault(root(i), []).append(i)
        for members in joined.values():
            keys = []  # each ring in its last piece: a piece holds every ring it was made with but those it lost
            for i in members:
                if i in broken:
                    mine = list(pieces[i])
                    for k in broken[i][0]:
                        mine.remove(k)
                    keys += mine
                else:
                    keys += pieces[i]
            if not any(i in broken for i in members):
                if keys:
                    self._solve(self._pending_t, sorted(keys), pending)
                continue
            if len(keys) >= self.VECTOR_MIN:  # as arrays, searched for its parts unless shown joined
                cut = [link for i in members if i in broken for link in broken[i][1]]
                for group in [keys] if self._joined(cut) else self.cols.parts(keys):
                    self._solve(self._pending_t, sorted(group), pending)
                continue
            rest = set(keys)
            while rest:
                group = self._connected(next(iter(rest)), rest)
                rest -= group
                self._solve(self._pending_t, sorted(group), pending)

    def next_finish(self) -> tuple[float, int] | None:
        """The earliest predicted end of a ring's last iteration."""
        self._flush()
        while self._heap:
            t, key = self._heap[0]
            if self.finish.get(key) == t:
                return t, key
            heapq.heappop(self._heap)
        return None

    def peek(self, t: float, key: int) -> tuple[RingState, float]:
        """A running ring's state and progress at `t` (no later than any coming change), changing nothing."""
        self._flush()
        comp, ring = self.comp[key], self.rings[key]
        f_t, f_done, f_period = comp.at(key)
        if t < comp.horizon:
            s = self._replay(comp, t)[key]
            return s, s.done + min(elapsed_of(s, ring, f_period, self._lat(ring)) / f_period, ALMOST_ONE)
        p = f_done + (t - f_t) / f_period
        return state_of(p, ring, f_period, self._lat(ring)), p

    def period(self, key: int) -> float:
        """The ring's current iteration time (measured or predicted)."""
        self._flush()
        return self.comp[key].at(key)[2]

    def mode(self, key: int) -> str:
        self._flush()
        return self.comp[key].mode

    def component(self, key: int) -> list[int]:
        self._flush()
        return list(self.comp[key].keys)

    def _lat(self, ring: Ring) -> float:
        """The ring's per-step latency: its own (`Ring.latency_s`) where set, else the network's."""
        return latency_of(ring, self.latency)

    def _fraction(self, s: RingState, ring: Ring, period: float) -> float:
        return min(elapsed_of(s, ring, period, self._lat(ring)) / period, ALMOST_ONE)

    def period_alone(self, ring: Ring) -> float:
        return iteration_time(ring, alone_rate(ring, self.capacity), self.latency)

    def periods_held(self, rings: list[Ring]) -> dict[int, float]:
        """Held shares: each ring's max-min rate among all of `rings`, for good, so its closed form."""
        rates = max_min({r.key: r.cap for r in rings}, {r.key: r.links for r in rings}, self.capacity)
        return {r.key: iteration_time(r, rates[r.key], self.latency) for r in rings}

    # --- components ------------------------------------------------------------------------
    def _connected(self, start: int, pool: set[int]) -> set[int]:
        """The rings of `pool` joined to `start` through shared links (each link's users looked at once)."""
        seen, todo, looked = {start}, [start], set()
        while todo:
            for link in self.rings[todo.pop()].links:
                if link in looked:
                    continue
                looked.add(link)
                for k in self.users.get(link, ()):
                    if k in pool and k not in seen:
                        seen.add(k)
                        todo.append(k)
        return seen

    JOIN_LOOKS = 128  # `_joined` looks at no more rings than this (each costs a look at its links)

    def _joined(self, cut: list[int]) -> bool:
        """Whether the links `cut` (those the rings that left a component crossed) that still carry rings are joined to
        each other through rings that cross two of them, found by a search from one of them that looks at no more
        than JOIN_LOOKS rings. Then what is left of the component is one component still (each part of it holds a
        ring that shared a link with a ring that left: it crosses one of `cut`), and with it whatever rings added at
        the instant joined to it. False: not shown so (it may still be one)."""
        users, rings = self.users, self.rings
        links = {link for link in cut if users[link]}
        left = len(links) - 1  # cut links not reached yet
        if left <= 0:
            return True
        first = next(iter(links))
        seen, todo, looks = {first}, [first], self.JOIN_LOOKS
        while todo:
            for k in users[todo.pop()]:
                looks -= 1
                if looks < 0:
                    return False
                for link in rings[k].links:
                    if link in links and link not in seen:
                        left -= 1
                        if not left:
                            return True
                        seen.add(link)
                        todo.append(link)
        return False

    def _settle(self, t: float, comp: _Comp | Block) -> None:
        """Hold the rings of `comp` at `t` as pending, with their states and progress; what the component computed
        since it was solved is added to `busy`."""
        piece = len(self._pieces)
        self._pieces.append(comp.keys)
        if isinstance(comp, Block):
            p = comp.p0 + (t - comp.t0) / comp.period
            cols, ix = self.cols, comp.ix
            cols.phase[ix], cols.remaining[ix], cols.step[ix], cols.done[ix] = comp.states(p, comp.period,
                                                                                          comp.latency)
            cols.progress[ix] = p
            if t > comp.t0:
                self.busy.add(comp.t0, t, comp.computed(p))
            self._pending.update(dict.fromkeys(comp.keys, (_COLUMNS, 0.0)))
        else:
            replayed = self._replay(comp, t) if t < comp.horizon else None
            computed = 0.0
            for k in comp.keys:
                ring, f = self.rings[k], comp.fluid[k]
                if replayed is not None:
                    s = replayed[k]
                    p = s.done + min(elapsed_of(s, ring, f.period, self._lat(ring)) / f.period, ALMOST_ONE)
                else:
                    p = f.done + (t - f.t) / f.period
                    s = state_of(p, ring, f.period, self._lat(ring))
                self._pending[k] = (s, p)
                if t > comp.t0:
                    computed += max(0.0, p - comp.p0[k]) * ring.busy_s * ring.n  # every rank computes each iteration
            if t > comp.t0:
                self.busy.add(comp.t0, t, computed)
        finish = self.finish
        self._piece_of.update(dict.fromkeys(comp.keys, piece))
        for k in comp.keys:  # no prediction while pending; `comp` is read only for rings not pending (a solve sets it)
            finish.pop(k, None)

    def _mode(self, keys: list[int]) -> str:
        if len(keys) == 1:
            return "alone"
        if self.force:
            return self.force
        if len(keys) > self.limits.rings:
            return "mean"
        per_round = sum(2 if self.rings[k].coarse else 2 * self.rings[k].steps + 1 for k in keys)
        small = len(keys) <= self.limits.rings and per_round <= self.limits.round_events
        return "detail" if small else "mean"

    def _solve(self, t: float, keys: list[int], pending: dict[int, tuple[object, float | None]]) -> None:
        mode = self._mode(keys)
        if mode == "mean" and len(keys) >= self.VECTOR_MIN:
            self._solve_block(t, keys, pending)
            return
        states = {k: self.cols.get(k)[0] if pending[k][0] is _COLUMNS else pending[k][0] for k in keys}
        if mode == "alone":
            periods = {keys[0]: self.period_alone(self.rings[keys[0]])}
        elif mode == "mean" and self.held:
            periods = self.periods_held([self.rings[k] for k in keys])
        elif mode == "mean":
            periods = self._mean_field(keys)
        else:  # detail: start from the alone pace, only to express progress as a fraction
            periods = {k: self.period_alone(self.rings[k]) for k in keys}
        p0 = {k: states[k].done + min(elapsed_of(states[k], self.rings[k], periods[k], self._lat(self.rings[k]))
                                      / periods[k], ALMOST_ONE) for k in keys}
        start = {k: states[k].copy() for k in keys} if mode == "detail" else {}  # only stepping through reads them
        comp = _Comp(keys, mode, t, start, p0)
        comp.fluid = {k: _Fluid(t, p0[k], periods[k]) for k in keys}
        for k in keys:
            self.comp[k] = comp
        if len(keys) > 1:
            self.shared.update(keys)
        self.stats[mode] += 1
        if mode == "detail":
            self._step_through(comp)
        self._predict(keys, [comp.fluid[k].t + max(0.0, self.targets[k] - comp.fluid[k].done) * comp.fluid[k].period
                             for k in keys])

    def _solve_block(self, t: float, keys: list[int], pending: dict[int, tuple[object, float | None]]) -> None:
        """`_solve` of a large mean-field component, as arrays (simulator/model/columns.py)."""
        cols = self.cols
        for k in keys:
            if pending[k][0] is not _COLUMNS:
                cols.put(k, pending[k][0], 0.0)
        block = Block(keys, t, cols)
        ix = block.ix
        if self.held:
            held = self.periods_held([self.rings[k] for k in keys])
            period = np.array([held[k] for k in keys])
        else:
            period = block.mean_field(self.cols, block.latency, self._inverse)
        block.period = period
        block.p0 = block.progress(cols.phase[ix], cols.remaining[ix], cols.step[ix], cols.done[ix], period,
                                  block.latency)
        self.comp.update(dict.fromkeys(keys, block))
        self.shared.update(keys)
        self.stats["mean"] += 1
        when = block.finishes()
        self.finish.update(zip(keys, when.tolist(), strict=True))
        first = int(np.argmin(when))  # the block's earliest end (the least key among equal ones): the heap needs only
        heapq.heappush(self._heap, (self.finish[keys[first]], keys[first]))  # it, as any change makes a new block

    def _mean_field(self, keys: list[int]) -> dict[int, float]:
        block = Block(keys, 0.0, self.cols)
        return dict(zip(keys, block.mean_field(self.cols, block.latency, self._inverse).tolist(), strict=True))

    def _predict(self, keys: list[int], when: list[float]) -> None:
        for k, w in zip(keys, when, strict=True):
            self.finish[k] = w
            heapq.heappush(self._heap, (w, k))
        if len(self._heap) > 4 * len(self.finish) + 64:  # mostly stale predictions: keep only the current ones
            self._heap = [(w, k) for k, w in self.finish.items()]
            heapq.heapify(self._heap)

    def _detail(self, comp: _Comp) -> Detail:
        if len(self._known) > 20_000:  # a bound on the memory: they are computed again when met again
            self._known.clear()
        return Detail([self.rings[k] for k in comp.keys], self.capacity, self.latency,
                      {k: s.copy() for k, s in comp.start.items()}, self.held, (self._known, self._tags))

    def _step_through(self, comp: _Comp) -> None:
        """Step the component until a ring finishes or each has done the window; then go on fluid."""
        d = self._detail(comp)
        window = {k: s.done + self.limits.window for k, s in comp.start.items()}
        out = d.run(comp.t0, math.inf, targets=self.targets, max_events=self.limits.events, window=window)
        self.stats["events"] += out.events
        comp.horizon = out.t
        for k in comp.keys:
            s, ring = d.states[k], self.rings[k]
            tail = s.ends[len(s.ends) // 2:]
            if len(tail) >= 2:
                period = (tail[-1] - tail[0]) / (len(tail) - 1)
            else:  # too few iterations to measure: the average pace since t0
                moved = s.done + min(elapsed_of(s, ring, comp.fluid[k].period, self._lat(ring)) / comp.fluid[k].period,
                                     ALMOST_ONE) - comp.p0[k]
                period = (out.t - comp.t0) / moved if moved > 0 and out.t > comp.t0 else comp.fluid[k].period
            done = float(self.targets[k]) if k in out.finished else \
                s.done + min(elapsed_of(s, ring, period, self._lat(ring)) / period, ALMOST_ONE)
            comp.fluid[k] = _Fluid(out.t, done, period)

    def _replay(self, comp: _Comp, t: float) -> dict[int, RingState]:
        d = self._detail(comp)
        d.run(comp.t0, t)
        return d.states

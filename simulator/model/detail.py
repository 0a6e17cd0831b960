"""Event-by-event simulation of rings that share links.

Between events the set of transferring rings is fixed and their rates are weighted max-min fair
(simulator/model/maxmin.py). A ring is stepped through either step by step (every ring step and every
latency gap an event: exact, the paper's rack) or, when `Ring.coarse`, a whole all-reduce at a
time (only the ends of its compute and communication phases are events, and the ring keeps its
share through its latency gaps: the cluster scale, where a step's latency is microseconds).
With `held` (the network's sharing "held", simulator/model/network.py), every ring keeps its share of
its links through its compute phases and latency gaps too: shares are set by the rings placed on a
link, not by those transferring at the instant, so the rates never change between joins and
leaves. That is the emulation's TCP over shallow drop-tail queues (simulator/model/calibration.py);
without it (sharing "maxmin"), a lossless fabric that hands idle capacity over at once.
Used for the paper's cases, for small studies, and to measure the steady state of rings that
share a link before the cluster engine goes on with their measured iteration times.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from operator import mul, sub, truediv

from simulator.model.maxmin import max_min
from simulator.model.rings import Ring, latency_of

COMPUTE, TRANSFER, GAP = 0, 1, 2
NEVER = 1 << 62  # a target no ring reaches


@dataclass
class RingState:
    """Where a ring is in its iteration."""

    phase: int = COMPUTE
    # seconds (compute, gap), bytes (transfer) or steps (transfer of a coarse ring); -1: a whole compute phase
    remaining: float = -1.0
    step: int = 0
    done: int = 0  # whole iterations done
    ends: list[float] = field(default_factory=list)  # when each iteration ended

    def copy(self) -> RingState:
        return RingState(self.phase, self.remaining, self.step, self.done, list(self.ends))


@dataclass
class Outcome:
    t: float  # where the simulation stopped
    finished: list[int]  # rings that reached their target at t
    events: int


class Detail:
    """Rings on shared links, advanced event by event from their current states."""

    def __init__(
        self,
        rings: list[Ring],
        capacity: list[float],
        latency: float,
        states: dict[int, RingState] | None = None,
        held: bool = False,
        known: tuple[dict[tuple[int, ...], dict[int, float]], dict[int, int]] | None = None,
    ):
        """`known`: rates already computed, shared between runs over the same rings (a dict by the tuple of the
        moving rings' tags, and each ring's tag: one per ring object, never reused); default: this run's own."""
        self.rings, self.held = {r.key: r for r in rings}, held
        self.capacity, self.latency = capacity, latency
        self.states = {r.key: (states or {}).get(r.key) or RingState() for r in rings}
        for key, s in self.states.items():
            if s.remaining < 0:
                s.remaining = self.rings[key].compute_s
        self.rates: dict[int, float] = {}
        self._stale = True
        # the rates of each set of moving rings met so far, by the rings' tags
        self._known, self._tags = known or ({}, {r.key: r.key for r in rings})

    def _rates(self) -> dict[int, float]:
        """The max-min rates of the rings transferring now (all of them, held): a function of which rings those are,
        so each set met again (the phases cycle) takes the rates computed the first time."""
        if self._stale:
            moving = tuple(self.states) if self.held else \
                tuple([k for k, s in self.states.items() if s.phase == TRANSFER])
            self.rates = self._solved(moving)
            self._stale = False
        return self.rates

    def _time_left(self, key: int) -> float:
        s = self.states[key]
        if s.phase != TRANSFER:
            return s.remaining
        ring = self.rings[key]
        rate = self._rates()[key]
        if ring.coarse:
            return s.remaining * (ring.step_bytes / rate + latency_of(ring, self.latency))
        return s.remaining / rate

    def run(
        self,
        t: float,
        until: float,
        targets: dict[int, int] | None = None,
        max_events: int = 10**9,
        window: dict[int, int] | None = None,
    ) -> Outcome:
        """Advance from time `t` to `until`, or to the first time a ring reaches its target count of
        iterations (`targets`: ring -> iterations), or until every ring has done its `window` count,
        or after `max_events` events."""
        targets = targets or {}
        if type(self) is Detail:  # a subclass may time or change phases otherwise: it takes the general loop
            if self.rings and all(r.coarse for r in self.rings.values()) and all(
                    s.phase != GAP and type(s.remaining) is float for s in self.states.values()):
                return self._run_coarse(t, until, targets, max_events, window)
            return self._run_lean(t, until, targets, max_events, window)
        events = 0
        while events < max_events:
            if window and all(self.states[k].done >= n for k, n in window.items()):
                break
            lefts = {k: self._time_left(k) for k in self.states}
            dt = min(lefts.values(), default=float("inf"))
            if t + dt > until:
                self._advance(until - t)
                return Outcome(until, [], events)
            self._advance(dt)
            t += dt
            finished = []
            for k, left in lefts.items():
                if left <= dt * (1 + 1e-9) + 1e-12:
                    if self._transition(k, t) and self.states[k].done >= targets.get(k, 1 << 62):
                        finished.append(k)
            events += 1
            if finished:
                return Outcome(t, finished, events)
        return Outcome(t, [], events)

    def _run_lean(self, t: float, until: float, targets: dict[int, int], max_events: int,
                  window: dict[int, int] | None) -> Outcome:
        """`run` with `_time_left`, `_advance` and `_transition` inlined, the same arithmetic in the same order (every
        float the same), and the window's rings still short of their count kept as a set, checked where an iteration
        ends. The transferring rings are kept as a bit mask, changed where a ring's phase changes, and each ring's pace
        under each mask met in this run (a coarse ring's step seconds, a fine one's rate: the same expressions) is
        computed once, from the mask's rates (a set of rings' rates are `_solved`'s, by their tags, computed once)."""
        rows = []
        mask = 0
        for i, (k, s) in enumerate(self.states.items()):
            ring = self.rings[k]
            steps = ring.steps
            rows.append((k, s, ring.coarse, ring.step_bytes, latency_of(ring, self.latency), steps, float(steps),
                         ring.compute_s, 1 << i))
            if s.phase == TRANSFER:
                mask |= 1 << i
        rates_of = self._rates_by_mask(rows)
        paces: dict[int, tuple[list[float], dict[int, float]]] = {}  # by mask: each ring's pace (0.0 idle), rates
        idle = [0.0] * len(rows)
        short = {k for k, n in window.items() if self.states[k].done < n} if window else None
        inf = float("inf")
        events = 0
        last = None  # the rates read last, kept as `self.rates` (as `_rates` keeps them)
        try:
            while events < max_events:
                if short is not None and not short:
                    break
                # each ring's time left, and for a transferring ring its step's seconds (coarse) or its rate: the paces
                # of a mask computed once in this run, from the rates of its rings (all of them, held)
                if mask:
                    entry = paces.get(mask)
                    if entry is None:
                        rates = rates_of(mask)
                        entry = paces[mask] = ([(row[3] / rates[row[0]] + row[4] if row[2] else rates[row[0]])
                                                if row[-1] & mask else 0.0 for row in rows], rates)
                    pace, last = entry
                    lefts = [row[1].remaining if not row[-1] & mask else row[1].remaining * per if row[2]
                             else row[1].remaining / per for row, per in zip(rows, pace, strict=True)]
                else:
                    pace = idle
                    lefts = [row[1].remaining for row in rows]
                dt = min(lefts, default=inf)
                if t + dt > until:
                    step = until - t
                    for row, per in zip(rows, pace, strict=True):
                        s = row[1]
                        if s.phase != TRANSFER:
                            s.remaining -= step
                        elif row[2]:
                            s.remaining -= step / per
                        else:
                            s.remaining -= per * step
                    return Outcome(until, [], events)
                t += dt
                finished = []
                edge = dt * (1 + 1e-9) + 1e-12
                # each ring advanced by dt at the pace just read, then its phase changed where it ended (`_transition`
                # inlined): a ring's change touches only its own state, so this is advancing every ring first and then
                # changing phases
                for (k, s, coarse, step_bytes, lat, steps, fsteps, compute_s, bit), per, left in \
                        zip(rows, pace, lefts, strict=True):
                    phase = s.phase
                    if phase != TRANSFER:
                        s.remaining -= dt
                    elif coarse:
                        s.remaining -= dt / per
                    else:
                        s.remaining -= per * dt
                    if left > edge:
                        continue
                    if phase == COMPUTE:
                        if steps:
                            s.phase, s.remaining, s.step = TRANSFER, fsteps if coarse else step_bytes, 0
                            mask |= bit
                            continue
                    else:
                        if phase == TRANSFER:
                            if coarse:
                                s.step = steps - 1
                            elif lat > 0:
                                s.phase, s.remaining = GAP, lat
                                mask &= ~bit
                                continue
                        s.step += 1
                        if s.step < steps:
                            s.phase, s.remaining = TRANSFER, step_bytes
                            mask |= bit
                            continue
                        mask &= ~bit
                    s.phase, s.remaining, s.step = COMPUTE, compute_s, 0
                    _iteration_ended(s, k, t, short, window, targets, finished)
                events += 1
                if finished:
                    return Outcome(t, finished, events)
            return Outcome(t, [], events)
        finally:
            if last is not None:
                self.rates = last
            self._stale = True  # `_rates` computes them again where asked after this run (the same floats)

    def _run_coarse(self, t: float, until: float, targets: dict[int, int], max_events: int,
                    window: dict[int, int] | None) -> Outcome:
        """`_run_lean` where every ring is coarse (none in a latency gap: a coarse ring never is): each ring's time
        left and its advance by `dt` as one expression for every phase, over lists of the rings' remainders and, per
        mask, divisors (a transferring ring's step seconds, 1.0 for the others: x * 1.0 and x / 1.0 are x, exactly, so
        every float is `_run_lean`'s); only the rings whose phase ended are looked at one by one."""
        keys = list(self.states)
        states = [self.states[k] for k in keys]
        rows = []
        mask = 0
        for i, (k, s) in enumerate(zip(keys, states, strict=True)):
            ring = self.rings[k]
            rows.append((k, s, True, ring.step_bytes, latency_of(ring, self.latency), ring.steps, float(ring.steps),
                         ring.compute_s, 1 << i))
            if s.phase == TRANSFER:
                mask |= 1 << i
        rem = [s.remaining for s in states]
        step = [s.step for s in states]
        rates_of = self._rates_by_mask(rows)
        paces: dict[int, tuple[list[float], dict[int, float] | None]] = {0: ([1.0] * len(rows), None)}
        short = {k for k, n in window.items() if self.states[k].done < n} if window else None
        events = 0
        last = None  # the rates read last, kept as `self.rates` (as `_rates` keeps them)
        try:
            while events < max_events:
                if short is not None and not short:
                    break
                entry = paces.get(mask)
                if entry is None:
                    rates = rates_of(mask)
                    entry = paces[mask] = ([row[3] / rates[row[0]] + row[4] if row[-1] & mask else 1.0
                                            for row in rows], rates)
                div, rates = entry
                if mask:
                    last = rates
                lefts = list(map(mul, rem, div))  # r * d, ring by ring (map: the loops in C)
                dt = min(lefts)
                if t + dt > until:
                    gone = until - t
                    rem = list(map(sub, rem, map(truediv, repeat(gone), div)))  # r - gone / d
                    return Outcome(until, [], events)
                t += dt
                rem = list(map(sub, rem, map(truediv, repeat(dt), div)))  # r - dt / d
                edge = dt * (1 + 1e-9) + 1e-12
                finished = []
                for i in [i for i, left in enumerate(lefts) if not left > edge]:  # those whose phase ended
                    k, s, _, _, _, steps, fsteps, compute_s, bit = rows[i]
                    if s.phase == COMPUTE and steps:
                        s.phase = TRANSFER
                        rem[i], step[i] = fsteps, 0
                        mask |= bit
                        continue
                    mask &= ~bit
                    s.phase = COMPUTE
                    rem[i], step[i] = compute_s, 0
                    _iteration_ended(s, k, t, short, window, targets, finished)
                events += 1
                if finished:
                    return Outcome(t, finished, events)
            return Outcome(t, [], events)
        finally:
            for s, r, n in zip(states, rem, step, strict=True):
                s.remaining, s.step = r, n
            if last is not None:
                self.rates = last
            self._stale = True

    def _rates_of(self, rows: list, mask: int) -> dict[int, float]:
        """The max-min rates of the rings of `rows` in `mask` (in their order), as `_rates` computes and keeps them."""
        return self._solved(tuple([row[0] for row in rows if row[-1] & mask]))

    def _rates_by_mask(self, rows: list):
        """The rates of the rings of a mask (of every ring while held), each solved once in a run: `_rates_of` by the
        mask alone (`_mask_solver`, made at the first mask met)."""
        everyone = (1 << len(rows)) - 1
        by_mask: dict[int, dict[int, float]] = {}
        solve = None

        def rates_of(mask: int) -> dict[int, float]:
            nonlocal solve
            key = everyone if self.held else mask
            rates = by_mask.get(key)
            if rates is None:
                if solve is None:
                    solve = self._mask_solver(rows)
                rates = by_mask[key] = solve(key)
            return rates

        return rates_of

    def _mask_solver(self, rows: list):
        """`_rates_of(rows, mask)` as a function of the mask alone: the same rates (`_solved`'s, the same dicts kept by
        the same tags), with the rings' tags, caps and the rings each shares a link with read once per run, and a set
        split into its parts (`_parts`'s, in the same order) by bit masks."""
        rings, known, tag = self.rings, self._known, self._tags.__getitem__
        keys = [row[0] for row in rows]
        tags = [tag(k) for k in keys]
        caps = [rings[k].cap for k in keys]
        one_cap = len(set(caps)) == 1  # then every set of them has one cap
        on_link: dict[int, int] = {}  # link -> the rings on it, as bits
        for i, k in enumerate(keys):
            for link in rings[k].links:
                on_link[link] = on_link.get(link, 0) | 1 << i
        near = []  # per ring, the rings sharing a link with it (itself included), as bits
        for k in keys:
            bits = 0
            for link in rings[k].links:
                bits |= on_link[link]
            near.append(bits)
        span = range(len(keys))
        by_part: dict[int, dict[int, float]] = {}  # this run's parts met, by mask

        def split(mask: int) -> list[int]:
            """The mask's parts (rings joined by shared links), by their first ring."""
            parts = []
            rest = mask
            while rest:
                part = grow = rest & -rest
                while grow:
                    reach = 0
                    while grow:
                        bit = grow & -grow
                        reach |= near[bit.bit_length() - 1]
                        grow ^= bit
                    grow = reach & rest & ~part
                    part |= grow
                rest &= ~part
                parts.append(part)
            return parts

        def solve(mask: int) -> dict[int, float]:
            ids = [i for i in span if mask >> i & 1]
            whole = tuple([tags[i] for i in ids])
            rates = known.get(whole)
            if rates is not None:
                return rates
            parts = split(mask) if len(ids) > 1 and (one_cap or len({caps[i] for i in ids}) == 1) else [mask]
            if len(parts) == 1:
                moving = [keys[i] for i in ids]
                rates = max_min({k: rings[k].cap for k in moving}, {k: rings[k].links for k in moving}, self.capacity)
            else:
                rates = {}
                for part in parts:
                    got = by_part.get(part)
                    if got is None:
                        members = [i for i in ids if part >> i & 1]
                        tkey = tuple([tags[i] for i in members])
                        got = known.get(tkey)
                        if got is None:
                            moving = [keys[i] for i in members]
                            got = known[tkey] = max_min({k: rings[k].cap for k in moving},
                                                        {k: rings[k].links for k in moving}, self.capacity)
                        by_part[part] = got
                    rates.update(got)
            known[whole] = rates
            return rates

        return solve

    def _solved(self, moving: tuple[int, ...]) -> dict[int, float]:
        """The max-min rates of the rings `moving` (in the states' order), computed once per set of rings (by their
        tags). Where every one of them has the same cap, the rings that share no link with the others' part are solved
        part by part, each part kept by its own tags too (a part met again in another set is not solved again): there
        progressive filling gives a part's rings the same floats alone as among the others (the others' rounds change
        none of its links; its own rounds freeze the same rings at the same levels in the same order; a round at the
        common cap freezes every ring left), which with different caps a cap's round freezing rings of several parts
        at once need not (they are solved whole then)."""
        tag = self._tags.__getitem__
        tags = tuple(map(tag, moving))
        known = self._known
        rates = known.get(tags)
        if rates is not None:
            return rates
        rings = self.rings
        parts = _parts(moving, rings) if len(moving) > 1 and len({rings[k].cap for k in moving}) == 1 else [moving]
        if len(parts) == 1:
            rates = max_min({k: rings[k].cap for k in moving}, {k: rings[k].links for k in moving}, self.capacity)
        else:
            rates = {}
            for part in parts:
                key = tuple(map(tag, part))
                got = known.get(key)
                if got is None:
                    got = known[key] = max_min({k: rings[k].cap for k in part}, {k: rings[k].links for k in part},
                                               self.capacity)
                rates.update(got)
        known[tags] = rates
        return rates

    def _advance(self, dt: float) -> None:
        rates = self._rates()
        for k, s in self.states.items():
            if s.phase != TRANSFER:
                s.remaining -= dt
            elif self.rings[k].coarse:
                s.remaining -= dt / (self.rings[k].step_bytes / rates[k] + latency_of(self.rings[k], self.latency))
            else:
                s.remaining -= rates[k] * dt

    def _transition(self, key: int, t: float) -> bool:
        """The phase of `key` ended at `t`; start the next. True when an iteration ended."""
        s, ring = self.states[key], self.rings[key]
        if s.phase == COMPUTE and ring.steps and ring.coarse:
            s.phase, s.remaining, s.step, self._stale = TRANSFER, float(ring.steps), 0, True
            return False
        if s.phase == TRANSFER:
            self._stale = True
            if ring.coarse:
                s.step = ring.steps - 1
            elif latency_of(ring, self.latency) > 0:
                s.phase, s.remaining = GAP, latency_of(ring, self.latency)
                return False
        if s.phase == COMPUTE and ring.steps:
            s.phase, s.remaining, s.step, self._stale = TRANSFER, ring.step_bytes, 0, True
            return False
        if s.phase != COMPUTE:
            s.step += 1
            if s.step < ring.steps:
                s.phase, s.remaining, self._stale = TRANSFER, ring.step_bytes, True
                return False
        s.phase, s.remaining, s.step = COMPUTE, ring.compute_s, 0
        s.done += 1
        s.ends.append(t)
        return True


def _iteration_ended(s: RingState, k: int, t: float, short: set[int] | None, window: dict[int, int] | None,
                     targets: dict[int, int], finished: list[int]) -> None:
    """Ring `k` ended an iteration at `t` (its state already back in compute): counted, its end kept, out of `short`
    once its window is done, and in `finished` once it reached its target (the lean and the coarse loop alike)."""
    s.done += 1
    s.ends.append(t)
    if short is not None and k in short and s.done >= window[k]:  # type: ignore[index]
        short.discard(k)
    if s.done >= targets.get(k, NEVER):
        finished.append(k)


def _parts(keys: tuple[int, ...], rings: dict[int, Ring]) -> list[tuple[int, ...]]:
    """`keys` split into the parts joined by shared links, each in the order of `keys`, the parts by their first."""
    parent = list(range(len(keys)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}  # link -> the first of `keys` on it
    for i, k in enumerate(keys):
        for link in rings[k].links:
            o = owner.setdefault(link, i)
            if o != i:
                a, b = root(o), root(i)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    parts: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        parts.setdefault(root(i), []).append(k)
    return [tuple(p) for p in parts.values()]

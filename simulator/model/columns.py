"""Where a ring is in its iteration, per ring and as arrays over a large component.

`state_of` and `elapsed_of` are the per-ring forms simulator/model/interference.py uses for small components. A
component
of hundreds of rings (the fixed policy's spread jobs at cluster scale) is settled and solved again at every arrival
and end that touches it; for it, `Block` does the same arithmetic as one numpy operation over a column per quantity
instead of one Python object per ring, in the per-ring code's order of operations, so every result is the same
float: IEEE arithmetic rounds +, -, *, / alike element by element, `_max`/`_min` keep Python's choice between equal
operands, and sums run in the per-ring loop's order. tests/unit/test_sim_columns.py checks the two paths agree.
"""
from __future__ import annotations

import math

import numpy as np

from simulator.model.detail import COMPUTE, GAP, TRANSFER, RingState
from simulator.model.meanfield import solve
from simulator.model.rings import Ring

ALMOST_ONE = 1 - 1e-9
STATIC = ("compute", "steps", "step_bytes", "coarse", "busy", "n", "cap", "target", "latency")
STATE = ("phase", "remaining", "step", "done", "progress")


def elapsed_of(s: RingState, ring: Ring, period: float, latency: float) -> float:
    """Seconds since the iteration began, for a ring whose steps share `period` evenly."""
    if s.phase == COMPUTE or not ring.steps:
        return ring.compute_s - s.remaining
    step = (period - ring.compute_s) / ring.steps
    if ring.coarse:
        return ring.compute_s + (ring.steps - s.remaining) * step
    transfer = max(step - latency, 0.0)
    base = ring.compute_s + s.step * step
    if s.phase == TRANSFER:
        return base + transfer * (1 - s.remaining / ring.step_bytes)
    return base + transfer + (latency - s.remaining)


def state_of(progress: float, ring: Ring, period: float, latency: float) -> RingState:
    """The inverse of `elapsed_of` for `progress` iterations done (fractional)."""
    done = math.floor(progress + 1e-9)
    elapsed = max(0.0, (progress - done) * period)
    if elapsed < ring.compute_s or not ring.steps:
        return RingState(COMPUTE, ring.compute_s - min(elapsed, ring.compute_s), 0, done)
    step = (period - ring.compute_s) / ring.steps
    if ring.coarse:
        return RingState(TRANSFER, max(ring.steps - (elapsed - ring.compute_s) / step, 1e-12), 0, done)
    k = min(int((elapsed - ring.compute_s) / step), ring.steps - 1)
    into = elapsed - ring.compute_s - k * step
    transfer = max(step - latency, 0.0)
    if into < transfer:
        return RingState(TRANSFER, ring.step_bytes * (1 - into / transfer), k, done)
    return RingState(2, max(latency - (into - transfer), 0.0), k, done)


def _max(a, b):
    """Python's max(a, b), element by element: b where b > a, else a."""
    return np.where(b > a, b, a)


def _min(a, b):
    """Python's min(a, b), element by element: b where b < a, else a."""
    return np.where(b < a, b, a)


class Columns:
    """Per-ring columns indexed by ring key (a job's index): what the ring is (set when it joins the fabric), where
    it was when its component was last settled, its last mean-field duty cycle, and its links as arrays."""

    def __init__(self):
        self.size = 0
        for name in STATIC + STATE + ("duty",):
            setattr(self, name, np.zeros(0))
        # each ring's links, in its order, as a run of the flat arrays: link ids and flows, from first[key], count[key]
        self.first, self.count = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.flat_link, self.flat_flows, self.used = np.zeros(1024, np.int64), np.zeros(1024), 0

    def _fit(self, key: int) -> None:
        if key < self.size:
            return
        size = max(2 * self.size, key + 1, 1024)
        for name in STATIC + STATE + ("duty",):
            old = getattr(self, name)
            new = np.zeros(size)
            new[: self.size] = old
            setattr(self, name, new)
        for name in ("first", "count"):
            old = getattr(self, name)
            new = np.zeros(size, np.int64)
            new[: self.size] = old
            setattr(self, name, new)
        self.size = size

    def set_ring(self, ring: Ring, target: int, latency: float = 0.0) -> None:
        """Store `ring` (to do `target` iterations) with its per-step latency `latency`."""
        k = ring.key
        self._fit(k)
        self.latency[k] = latency
        self.compute[k], self.steps[k], self.step_bytes[k] = ring.compute_s, ring.steps, ring.step_bytes
        self.coarse[k], self.busy[k], self.n[k], self.cap[k] = ring.coarse, ring.busy_s, ring.n, ring.cap
        self.target[k] = target
        count = len(ring.links)
        if self.used + count > len(self.flat_link):
            grown = max(2 * len(self.flat_link), self.used + count)
            self.flat_link = np.concatenate([self.flat_link, np.zeros(grown - len(self.flat_link), np.int64)])
            self.flat_flows = np.concatenate([self.flat_flows, np.zeros(grown - len(self.flat_flows))])
        self.flat_link[self.used: self.used + count] = list(ring.links)
        self.flat_flows[self.used: self.used + count] = list(ring.links.values())
        self.first[k], self.count[k] = self.used, count
        self.used += count

    def drop(self, key: int) -> None:
        self.duty[key] = 0.0

    def pairs(self, ix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The links of the rings `ix`, ring after ring, each ring's in its order: (links per ring, link ids, flows)."""
        counts = self.count[ix]
        at = np.repeat(self.first[ix] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        return counts, self.flat_link[at], self.flat_flows[at]

    def parts(self, keys: list[int]) -> list[list[int]]:
        """`keys` split into its components, rings joined through the links they share: labels (each ring's least
        index in its part) spread over links and back until none changes, short-cut through the labels' own."""
        ix = np.array(keys, dtype=np.int64)
        counts, link_of, _ = self.pairs(ix)
        ring_of = np.repeat(np.arange(len(ix)), counts)
        label = np.arange(len(ix))
        bins = int(link_of.max()) + 1 if len(link_of) else 0
        while True:
            on_link = np.full(bins, len(ix))
            np.minimum.at(on_link, link_of, label[ring_of])
            new = label.copy()
            np.minimum.at(new, ring_of, on_link[link_of])
            while True:
                short = new[new]
                if np.array_equal(short, new):
                    break
                new = short
            if np.array_equal(new, label):
                break
            label = new
        order = np.argsort(label, kind="stable")
        cuts = np.flatnonzero(np.diff(label[order])) + 1
        return [ix[part].tolist() for part in np.split(order, cuts)]

    def put(self, key: int, s: RingState, progress: float) -> None:
        self.phase[key], self.remaining[key], self.step[key], self.done[key] = s.phase, s.remaining, s.step, s.done
        self.progress[key] = progress

    def get(self, key: int) -> tuple[RingState, float]:
        """The state stored for `key`, as the per-ring path makes it (integers where it has integers)."""
        s = RingState(int(self.phase[key]), float(self.remaining[key]), int(self.step[key]), int(self.done[key]))
        return s, float(self.progress[key])


class Block:
    """One large component's rings as arrays (sorted by key), solved at `t0`: progress `p0` and iteration time
    `period` (fluid from `t0` on, like interference._Fluid), and the static columns gathered once."""

    mode = "mean"
    horizon = -np.inf

    def __init__(self, keys: list[int], t0: float, cols: Columns):
        self.keys, self.t0 = keys, t0
        self.ix = np.array(keys, dtype=np.int64)
        self._pos: dict[int, int] | None = None
        for name in STATIC:
            setattr(self, name, getattr(cols, name)[self.ix])
        self.p0 = self.period = np.zeros(0)

    def at(self, key: int) -> tuple[float, float, float]:
        """(t, done, period) of one ring, as interference._Fluid holds them."""
        if self._pos is None:
            self._pos = dict(zip(self.keys, range(len(self.keys)), strict=True))
        i = self._pos[key]
        return self.t0, float(self.p0[i]), float(self.period[i])

    def states(self, p: np.ndarray, period: np.ndarray, latency: float | np.ndarray):
        """interference.state_of over the block: (phase, remaining, step, done) columns for progress `p`."""
        compute, steps = self.compute, self.steps
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            done = np.floor(p + 1e-9)
            elapsed = _max(0.0, (p - done) * period)
            computing = (elapsed < compute) | (steps == 0)
            step = (period - compute) / steps
            rem_compute = compute - _min(elapsed, compute)
            rem_coarse = _max(steps - (elapsed - compute) / step, 1e-12)
            k = _min(np.trunc((elapsed - compute) / step), steps - 1)
            into = elapsed - compute - k * step
            transfer = _max(step - latency, 0.0)
            moving = into < transfer
            rem_moving = self.step_bytes * (1 - into / transfer)
            rem_gap = _max(latency - (into - transfer), 0.0)
        coarse = self.coarse != 0
        phase = np.where(computing, COMPUTE, np.where(coarse | moving, TRANSFER, GAP))
        remaining = np.where(computing, rem_compute, np.where(coarse, rem_coarse,
                                                              np.where(moving, rem_moving, rem_gap)))
        return phase, remaining, np.where(computing | coarse, 0.0, k), done

    def progress(self, phase, remaining, step, done, period: np.ndarray, latency: float | np.ndarray) -> np.ndarray:
        """done + interference.elapsed_of / period, capped below one iteration, over the block."""
        compute, steps = self.compute, self.steps
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            each = (period - compute) / steps
            e_compute = compute - remaining
            e_coarse = compute + (steps - remaining) * each
            transfer = _max(each - latency, 0.0)
            base = compute + step * each
            e_moving = base + transfer * (1 - remaining / self.step_bytes)
            e_gap = base + transfer + (latency - remaining)
            elapsed = np.where((phase == COMPUTE) | (steps == 0), e_compute,
                               np.where(self.coarse != 0, e_coarse, np.where(phase == TRANSFER, e_moving, e_gap)))
            return done + _min(elapsed / period, ALMOST_ONE)

    def computed(self, p: np.ndarray) -> float:
        """GPU-seconds computed since t0, summed ring by ring in key order as the per-ring loop sums them."""
        x = p - self.p0
        x = np.where(x > 0.0, x, 0.0) * self.busy * self.n
        return float(np.cumsum(x)[-1]) if len(x) else 0.0

    def finishes(self) -> np.ndarray:
        """Each ring's predicted end of its last iteration."""
        left = self.target - self.p0
        return self.t0 + np.where(left > 0.0, left, 0.0) * self.period

    def mean_field(self, cols: Columns, latency: float | np.ndarray, inverse_capacity: np.ndarray) -> np.ndarray:
        """simulator/model/meanfield.py's fixed point over the block's rings, from and to their duty cycles in `cols`; a
        ring with no steps computes only."""
        talking = self.steps != 0
        period = self.compute.copy()
        if not talking.any():
            return period
        ix, steps = self.ix[talking], self.steps[talking]
        counts, link_of, weight = cols.pairs(ix)
        new, d = solve(self.compute[talking], steps * self.step_bytes[talking],
                       steps * np.broadcast_to(latency, talking.shape)[talking],
                       1.0 / self.cap[talking], counts, link_of, weight, inverse_capacity, cols.duty[ix])
        cols.duty[ix] = d
        period[talking] = new
        return period

"""Iteration times of many rings sharing links, when stepping through each ring step costs too much.

Each ring transfers a fraction d_k of its time (its duty cycle). A ring's step on link l is
expected to share l with (w_jl + sum over the others of w_kl * d_k) flows, independent phases
assumed; its transfer time per byte is the worst such share over its links, or its NIC. The
duty cycles depend on the iteration times and the iteration times on the duty cycles, so the
two are iterated (damped) to a fixed point, starting from the duty cycles of the last solve.
It ignores phase locking (which time shifting exploits), so the cluster engine uses it only
for components too large to step through.
"""
from __future__ import annotations

import itertools

import numpy as np

from simulator.model.rings import Ring, latency_of

TOLERANCE = 1e-4  # relative change of every iteration time between two rounds
ROUNDS = 100


def mean_field(rings: list[Ring], capacity: list[float], latency: float, duty: dict[int, float] | None = None) \
        -> tuple[dict[int, float], dict[int, float]]:
    """(ring key -> expected iteration time, ring key -> duty cycle); `duty`: a starting guess."""
    duty = {r.key: (duty or {}).get(r.key, 0.0) for r in rings}
    periods = {r.key: r.compute_s for r in rings}
    talking = [r for r in rings if r.steps]
    if not talking:
        return periods, duty
    keys = [r.key for r in talking]
    counts = np.array([len(r.links) for r in talking], dtype=np.int64)
    link_of = np.fromiter(itertools.chain.from_iterable(r.links for r in talking), np.int64, int(counts.sum()))
    weight = np.fromiter(itertools.chain.from_iterable(r.links.values() for r in talking), float, len(link_of))
    period, d = solve(np.array([r.compute_s for r in talking]), np.array([r.steps * r.step_bytes for r in talking]),
                      np.array([r.steps * latency_of(r, latency) for r in talking]),
                      np.array([1.0 / r.cap for r in talking]),
                      counts, link_of, weight, 1.0 / np.asarray(capacity, dtype=float),
                      np.array([duty[k] for k in keys]))
    periods.update(zip(keys, period.tolist(), strict=True))
    duty.update(zip(keys, d.tolist(), strict=True))
    return periods, duty


def solve(compute: np.ndarray, volume: np.ndarray, waits: np.ndarray, own: np.ndarray, counts: np.ndarray,
          link_of: np.ndarray, weight: np.ndarray, inverse_capacity: np.ndarray, d: np.ndarray) \
        -> tuple[np.ndarray, np.ndarray]:
    """The fixed point over arrays, ring by ring (compute, bytes and latency per iteration, 1 / own cap, links
    crossed) and pair by pair (`link_of`, `weight`: each ring's links in its order, `counts` of them per ring);
    `d`: starting duty cycles. Returns (iteration times, duty cycles).

    Each round is a Jacobi step (every ring's new duty cycle from the loads of the round before), computed for all
    rings at once over their (ring, link) pairs; a link's load sums its pairs in their order, as a ring-by-ring
    loop would."""
    ring_of = np.repeat(np.arange(len(compute)), counts)
    inverse = inverse_capacity[link_of]
    bins = int(link_of.max()) + 1 if len(link_of) else 0
    linked = counts > 0
    starts = (np.cumsum(counts) - counts)[linked]
    every = bool(linked.all())  # every ring crosses a link: no mask (the same values)
    own_linked = own if every else own[linked]
    # each round's arrays written in place into these (the same operations in the same order: the same floats); the
    # gathers and the largest change called as the arrays' and the ufunc's own methods (numpy's module functions wrap
    # them in Python: the same C loops)
    period, new, change = compute.copy(), np.empty(len(compute)), np.empty(len(compute))
    wd, share = np.empty(len(link_of)), np.empty(len(link_of))
    d = np.array(d, dtype=float)  # the caller's array is left as it is
    largest = np.maximum.reduce
    for _ in range(ROUNDS):
        d.take(ring_of, out=wd, mode="clip")  # weight * d per pair
        np.multiply(weight, wd, out=wd)
        load = np.bincount(link_of, weights=wd, minlength=bins)
        load.take(link_of, out=share, mode="clip")  # (weight + load - wd) * inverse, in that order
        np.add(weight, share, out=share)
        np.subtract(share, wd, out=share)
        np.multiply(share, inverse, out=share)
        if not len(starts):
            per_byte = own.copy()
        elif every:  # the worst share over each ring's links (max is exact: any grouping gives the same)
            per_byte = np.maximum.reduceat(share, starts)
            np.maximum(own_linked, per_byte, out=per_byte)
        else:
            per_byte = own.copy()
            per_byte[linked] = np.maximum(own_linked, np.maximum.reduceat(share, starts))
        transfer = np.multiply(volume, per_byte, out=per_byte)
        np.add(compute, transfer, out=new)  # compute + transfer + waits
        np.add(new, waits, out=new)
        np.subtract(new, period, out=change)  # the largest |new - period| / new
        np.abs(change, out=change)
        np.divide(change, new, out=change)
        worst = float(largest(change))
        period, new = new, period
        # damped: 0.5 * d + 0.5 * transfer / period, as 0.5 * (d + transfer / period): halving is exact (no duty cycle
        # comes near the subnormal range), so the same floats
        np.divide(transfer, period, out=transfer)
        np.add(d, transfer, out=d)
        np.multiply(d, 0.5, out=d)
        if worst < TOLERANCE:
            break
    return period, d

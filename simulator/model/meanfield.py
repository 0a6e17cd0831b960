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
    period = compute.copy()
    every = bool(linked.all())  # every ring crosses a link: no mask (the same values)
    own_linked = own if every else own[linked]
    for _ in range(ROUNDS):
        wd = weight * d[ring_of]
        load = np.bincount(link_of, weights=wd, minlength=bins)
        share = load[link_of]  # (weight + load - wd) * inverse, in that order, in place
        np.add(weight, share, out=share)
        np.subtract(share, wd, out=share)
        np.multiply(share, inverse, out=share)
        if not len(starts):
            per_byte = own.copy()
        elif every:  # the worst share over each ring's links (max is exact: any grouping gives the same)
            per_byte = np.maximum(own_linked, np.maximum.reduceat(share, starts))
        else:
            per_byte = own.copy()
            per_byte[linked] = np.maximum(own_linked, np.maximum.reduceat(share, starts))
        transfer = volume * per_byte
        new = compute + transfer + waits
        worst = float(np.max(np.abs(new - period) / new))
        period = new
        d = 0.5 * d + 0.5 * transfer / new  # damped
        if worst < TOLERANCE:
            break
    return period, d

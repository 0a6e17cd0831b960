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

from simulator.rings import Ring

TOLERANCE = 1e-4  # relative change of every iteration time between two rounds
ROUNDS = 100


def mean_field(rings: list[Ring], capacity: list[float], latency: float, duty: dict[int, float] | None = None) \
        -> tuple[dict[int, float], dict[int, float]]:
    """(ring key -> expected iteration time, ring key -> duty cycle); `duty`: a starting guess.

    Each round is a Jacobi step (every ring's new duty cycle from the loads of the round before), computed for all
    rings at once over their (ring, link) pairs; the sums run in the same order as a ring-by-ring loop would."""
    duty = {r.key: (duty or {}).get(r.key, 0.0) for r in rings}
    periods = {r.key: r.compute_s for r in rings}
    talking = [r for r in rings if r.steps]
    if not talking:
        return periods, duty
    keys = [r.key for r in talking]
    compute = np.array([r.compute_s for r in talking])
    volume = np.array([r.steps * r.step_bytes for r in talking])
    waits = np.array([r.steps * latency for r in talking])
    own = np.array([1.0 / r.cap for r in talking])
    counts = [len(r.links) for r in talking]
    ring_of = np.repeat(np.arange(len(talking)), counts)
    link_of = np.fromiter(itertools.chain.from_iterable(r.links for r in talking), np.int64, len(ring_of))
    weight = np.fromiter(itertools.chain.from_iterable(r.links.values() for r in talking), float, len(ring_of))
    inverse = 1.0 / np.asarray(capacity, dtype=float)[link_of]
    links, link_ix = np.unique(link_of, return_inverse=True)
    d = np.array([duty[k] for k in keys])
    period = compute.copy()
    for _ in range(ROUNDS):
        wd = weight * d[ring_of]
        load = np.bincount(link_ix, weights=wd, minlength=len(links))
        share = (weight + load[link_ix] - wd) * inverse
        per_byte = own.copy()
        np.maximum.at(per_byte, ring_of, share)
        transfer = volume * per_byte
        new = compute + transfer + waits
        worst = float(np.max(np.abs(new - period) / new))
        period = new
        d = 0.5 * d + 0.5 * transfer / new  # damped
        if worst < TOLERANCE:
            break
    periods.update(zip(keys, period.tolist(), strict=True))
    duty.update(zip(keys, d.tolist(), strict=True))
    return periods, duty

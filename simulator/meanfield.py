"""Iteration times of many rings sharing links, when stepping through each ring step costs too much.

Each ring transfers a fraction d_k of its time (its duty cycle). A ring's step on link l is
expected to share l with (w_jl + sum over the others of w_kl * d_k) flows, independent phases
assumed; its transfer time per byte is the worst such share over its links, or its NIC. The
duty cycles depend on the iteration times and the iteration times on the duty cycles, so the
two are iterated to a fixed point. It ignores phase locking (which time shifting exploits), so
the cluster engine uses it only for components too large to step through.
"""
from __future__ import annotations

from simulator.rings import Ring


def mean_field(rings: list[Ring], capacity: list[float], latency: float, rounds: int = 60, tol: float = 1e-7) \
        -> dict[int, float]:
    """Ring key -> expected iteration time."""
    duty = {r.key: 0.0 for r in rings}
    periods = {r.key: r.compute_s for r in rings}
    for _ in range(rounds):
        load: dict[int, float] = {}
        for r in rings:
            for link, w in r.links.items():
                load[link] = load.get(link, 0.0) + w * duty[r.key]
        worst = 0.0
        for r in rings:
            if not r.steps:
                continue
            per_byte = 1.0 / r.cap
            for link, w in r.links.items():
                per_byte = max(per_byte, (w + load[link] - w * duty[r.key]) / capacity[link])
            transfer = r.steps * r.step_bytes * per_byte
            period = r.compute_s + transfer + r.steps * latency
            new_duty = 0.5 * duty[r.key] + 0.5 * transfer / period  # damped
            worst = max(worst, abs(period - periods[r.key]) / period)
            periods[r.key], duty[r.key] = period, new_duty
        if worst < tol:
            break
    return periods

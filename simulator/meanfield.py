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

from simulator.rings import Ring

TOLERANCE = 1e-4  # relative change of every iteration time between two rounds
ROUNDS = 100


def mean_field(rings: list[Ring], capacity: list[float], latency: float, duty: dict[int, float] | None = None) \
        -> tuple[dict[int, float], dict[int, float]]:
    """(ring key -> expected iteration time, ring key -> duty cycle); `duty`: a starting guess."""
    duty = {r.key: (duty or {}).get(r.key, 0.0) for r in rings}
    talking = [(r.key, r.compute_s, r.steps * r.step_bytes, r.steps * latency, 1.0 / r.cap,
                [(link, w, 1.0 / capacity[link]) for link, w in r.links.items()]) for r in rings if r.steps]
    periods = {r.key: r.compute_s for r in rings}
    for _ in range(ROUNDS):
        load: dict[int, float] = {}
        for key, _, _, _, _, links in talking:
            d = duty[key]
            for link, w, _ in links:
                load[link] = load.get(link, 0.0) + w * d
        worst = 0.0
        for key, compute, volume, waits, per_byte, links in talking:
            d = duty[key]
            for link, w, inverse in links:
                share = (w + load[link] - w * d) * inverse
                if share > per_byte:
                    per_byte = share
            transfer = volume * per_byte
            period = compute + transfer + waits
            change = abs(period - periods[key]) / period
            if change > worst:
                worst = change
            periods[key] = period
            duty[key] = 0.5 * d + 0.5 * transfer / period  # damped
        if worst < TOLERANCE:
            break
    return periods, duty

"""CASSINI-style time shifting: when a new ring must share links, delay its first iteration so its
communication falls in the others' compute phases.

Each ring's demand on a link is a periodic on/off pattern: off while it computes, its alone
rate (x its flows there) while it communicates. For a candidate delay of the new ring, the
compatibility score of a link is 1 - (demand above capacity, integrated) / (capacity x horizon),
as in CASSINI (Rajasekaran et al.; seed 003's slides: score = 1 - sum Excess / (|A| C)); the
horizon, HORIZON_PERIODS of the longest period, stands in for the least common multiple of
the periods. The delay with the best summed score wins, the smallest on a tie; no delay unless
one scores better than none.
"""
from __future__ import annotations

from simulator.rings import Ring, alone_rate

HORIZON_PERIODS = 8
GRID = 32  # candidate delays per period of the new ring, besides those that align with a peer's pause


def _windows(compute: float, period: float, elapsed: float, horizon: float) -> list[tuple[float, float]]:
    """Communication intervals within [0, horizon) of a ring `elapsed` seconds into an iteration at 0
    (negative `elapsed`: it starts that much later)."""
    out, begin = [], -elapsed
    while begin < horizon:
        a, b = max(begin + compute, 0.0), min(begin + period, horizon)
        if b > a:
            out.append((a, b))
        begin += period
    return out


def excess(patterns: list[tuple[list[tuple[float, float]], float]], capacity: float) -> float:
    """Integral over time of max(0, summed demand - capacity); `patterns`: (intervals, demand)."""
    edges = sorted((t, d if k == 0 else -d) for intervals, d in patterns for iv in intervals for k, t in enumerate(iv))
    level, last, total = 0.0, 0.0, 0.0
    for t, delta in edges:
        if level > capacity:
            total += (level - capacity) * (t - last)
        level, last = level + delta, t
    return total


def scores(ring: Ring, period: float, delay: float, peers: list[tuple[Ring, float, float]], capacity: list[float]) \
        -> dict[int, float]:
    """Compatibility score of each link the new ring shares, if it starts `delay` from now.
    `peers`: (ring, its period now, seconds into its current iteration; negative: it starts that much later)."""
    horizon = HORIZON_PERIODS * max([period] + [p for _, p, _ in peers])
    out = {}
    for link, flows in ring.links.items():
        patterns = [(_windows(ring.compute_s, period, -delay, horizon), flows * alone_rate(ring, capacity))]
        for peer, p, elapsed in peers:
            if link in peer.links:
                patterns.append((_windows(peer.compute_s, p, elapsed, horizon),
                                 peer.links[link] * alone_rate(peer, capacity)))
        if len(patterns) > 1:
            out[link] = 1 - excess(patterns, capacity[link]) / (capacity[link] * horizon)
    return out


def best_shift(ring: Ring, period: float, peers: list[tuple[Ring, float, float]], capacity: list[float]) \
        -> tuple[float, float, float]:
    """(delay, summed score without delay, summed score with it) for a new ring among `peers`."""
    candidates = {i * period / GRID for i in range(GRID)}
    for _, p, elapsed in peers:  # start communicating just as a peer stops
        for k in range(HORIZON_PERIODS):
            candidates.add(((k + 1) * p - elapsed - ring.compute_s) % period)
    base = sum(scores(ring, period, 0.0, peers, capacity).values())
    best = (base, 0.0)
    for delay in sorted(candidates):
        total = sum(scores(ring, period, delay, peers, capacity).values())
        if total > best[0] + 1e-9:
            best = (total, delay)
    return best[1], base, best[0]

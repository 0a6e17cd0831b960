"""CASSINI-style time shifting: when a new ring must share links, delay its first iteration so its
communication falls in the others' compute phases.

Each ring's demand on a link is a periodic on/off pattern: off while it computes, its alone
rate (x its flows there) while it communicates. For a candidate delay of the new ring, the
compatibility score of a link is 1 - (demand above capacity, integrated) / (capacity x horizon),
as in CASSINI (Rajasekaran et al.; seed 003's slides: score = 1 - sum Excess / (|A| C)); the
horizon, HORIZON_PERIODS of the longest period, stands in for the least common multiple of
the periods. Links whose summed peak demand fits their capacity cannot gain and are left out.
The delay with the best mean score wins, the smallest on a tie; no delay unless one scores
better than none.
"""
from __future__ import annotations

from simulator.model.rings import Ring, alone_rate

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


def _edges(intervals: list[tuple[float, float]], demand: float) -> list[tuple[float, float]]:
    return [e for a, b in intervals for e in ((a, demand), (b, -demand))]


def excess(edges: list[tuple[float, float]], capacity: float) -> float:
    """Integral over time of max(0, summed demand - capacity); `edges`: sorted (time, demand change)."""
    level, last, total = 0.0, 0.0, 0.0
    for t, delta in edges:
        if level > capacity:
            total += (level - capacity) * (t - last)
        level, last = level + delta, t
    return total


def best_shift(ring: Ring, period: float, peers: list[tuple[Ring, float, float]], capacity: list[float]) \
        -> tuple[float, float, float]:
    """(delay, mean score of the shared links without delay, with it) for a new ring among `peers`:
    (ring, its period now, seconds into its current iteration; negative: it starts that much later)."""
    horizon = HORIZON_PERIODS * max([period] + [p for _, p, _ in peers])
    links = []  # (own demand, the peers' edges, capacity) of each link where demand can exceed capacity
    for link, flows in ring.links.items():
        own = flows * alone_rate(ring, capacity)
        sharing = [(peer, p, elapsed) for peer, p, elapsed in peers if link in peer.links]
        demands = [peer.links[link] * alone_rate(peer, capacity) for peer, _, _ in sharing]
        if not sharing or own + sum(demands) <= capacity[link] * (1 + 1e-9):
            continue
        edges = sorted(e for (peer, p, elapsed), d in zip(sharing, demands, strict=True)
                       for e in _edges(_windows(peer.compute_s, p, elapsed, horizon), d))
        links.append((own, edges, capacity[link]))
    if not links:
        return 0.0, 1.0, 1.0

    def score(delay: float) -> float:
        own_windows = _windows(ring.compute_s, period, -delay, horizon)
        total = 0.0
        for own, edges, cap in links:
            total += 1 - excess(sorted(edges + _edges(own_windows, own)), cap) / (cap * horizon)
        return total / len(links)

    candidates = {round(i * period / GRID, 9) for i in range(GRID)}
    for _, p, elapsed in peers:  # start communicating just as a peer stops
        for k in (1, 2):
            candidates.add(round((k * p - elapsed - ring.compute_s) % period, 9))
    base = score(0.0)
    best = (base, 0.0)
    for delay in sorted(candidates):
        s = score(delay)
        if s > best[0] + 1e-9:
            best = (s, delay)
    return best[1], base, best[0]

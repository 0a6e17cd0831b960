"""Weighted max-min fair rates: every ring gets one rate, and uses it on each of its flows.

A ring step ends when its slowest flow ends, so a ring is modelled as moving all its flows at
one rate x_j (a coflow): on link l it uses w_jl * x_j, where w_jl counts its flows on l. Rates
are max-min fair over the rings, capped by each ring's NICs (progressive filling).
"""
from __future__ import annotations

from collections.abc import Mapping


def max_min(
    caps: Mapping[int, float], uses: Mapping[int, Mapping[int, int]], capacity: Mapping[int, float] | list[float]
) -> dict[int, float]:
    """Rates for rings `caps` (ring -> own cap), `uses` (ring -> {link: flows}), link `capacity`."""
    if len(caps) == 1:  # alone: its cap or its narrowest link
        ((j, cap),) = caps.items()
        return {j: min([cap] + [capacity[link] / w for link, w in uses.get(j, {}).items()])}
    rates: dict[int, float] = {}
    remaining: dict[int, float] = {}
    users: dict[int, set[int]] = {}
    weight: dict[int, int] = {}  # active flows on each link (integers: summed in any order, the same)
    for j, links in uses.items():
        active = j in caps
        for link, w in links.items():
            if link in remaining:
                users[link].add(j)
                if active:
                    weight[link] += w
            else:
                remaining[link] = capacity[link]
                users[link] = {j}
                weight[link] = w if active else 0
    active = set(caps)
    empty: dict[int, int] = {}
    # each link's share per flow now, in the links' order (a link none of the active rings uses left out): only the
    # links of the rings frozen in a round change, so only theirs are divided again
    ratio = {link: remaining[link] / w for link, w in weight.items() if w}
    while active:
        level, tight = min([caps[j] for j in active]), None
        for link, r in ratio.items():
            if r < level:
                level, tight = r, link
        frozen = {j for j in active if caps[j] <= level} if tight is None else {j for j in users[tight] if j in active}
        touched = []
        for j in frozen:
            rates[j] = level
            for link, w in uses.get(j, empty).items():
                left = remaining[link] - w * level
                remaining[link] = left if left > 0.0 else 0.0  # max(0.0, left), NaN and -0.0 included
                weight[link] -= w
                touched.append(link)
        for link in touched:
            w = weight[link]
            if w:
                ratio[link] = remaining[link] / w
            else:
                ratio.pop(link, None)
        active -= frozen
    return rates

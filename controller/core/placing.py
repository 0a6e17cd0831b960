"""Placing GPUs of a pool (controller/core/pools.py) under switches, step by step: each step the switch that takes the
most of them, then with the fewest circuit changes, then the first; the GPUs put under it, stayers first, then the
cheapest moves. controller/core/placement.py and defrag.py place through `_place`."""
from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from controller.core.occupancy import Occupancy
from controller.core.pools import _PLANNING, NoRoomNow


def _assign(occ: Occupancy, pool, w: int, k: int, original: dict[int, int]) -> list[int]:
    """Put `k` GPUs of `pool` under switch `w`: stayers first, then the cheapest moves."""
    ix = occ.ix
    placed = pool.stayers(w, k)[:k]
    k -= len(placed)
    if k <= 0:
        return placed
    rows = pool.rows(occ, w)
    take = {row[0]: 0 for row in rows}
    for tier in (1, 2, 3):
        for row in rows:
            t = min(k, row[tier])
            take[row[0]] += t
            k -= t
    for g, m in take.items():
        if not m:
            continue
        movers = pool.movers(g, w, m)
        slots = sorted(occ.empty[w][g])[:m]  # a switch's few downlinks: nsmallest's (distinct ids), sorted in C
        if len(slots) < m:
            idle = (d for d in occ.idle[w][g] if not pool.member(ix.port_gpu[occ.partner[d]]))
            slots += heapq.nsmallest(m - len(slots), idle)
        for gi, d in zip(movers, slots, strict=True):
            original.setdefault(gi, occ.partner[ix.gpu_port[gi]])
            other = occ.partner[d]
            if other >= 0:
                original.setdefault(ix.port_gpu[other], d)
            occ.move(gi, d)
        placed += movers
    return placed


def _place(occ: Occupancy, pool, n: int, fixed: bool, original: dict[int, int],
           only: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Place `n` GPUs of `pool` under the fewest switches (greedy: the switch that takes the most,
    then the fewest changes, then the first); mutates `occ` (callers wrap it in `occ.tentative()`).
    `only`: all of them under one of these switches, or NoRoomNow. Returns (GPU ids placed, switch ids used)."""
    if fixed and not pool.fixed_set:
        return _place_fixed(occ, pool, n, only)
    return _place_steps(occ, pool, n, fixed, original, only)


def _place_fixed(occ: Occupancy, pool, n: int, only: Sequence[int] | None) -> tuple[list[int], list[int]]:
    """`_place_steps` for a model pool under the fixed policy (no moves: each step takes the idle GPUs of the pool's
    models under the switch with the most of them, up to the need, the first among equals), each step's switch read
    from one copy of the counts per switch: a step's holds change only its own switch's count, which a used switch's
    zero stands for (`best` zeroes the used ones). The same steps, holds and errors in the same order."""
    models = pool.models
    stay = occ.n_stay[:, models[0]].copy() if len(models) == 1 else occ.n_stay[:, models].sum(axis=1)
    if only is not None:
        stay[[w for w in range(len(occ.ix.switches)) if w not in only]] = 0
    fits = np.empty_like(stay)
    placed: list[int] = []
    used: list[int] = []
    while True:
        need = n - len(placed)
        np.minimum(stay, need, out=fits)
        w = int(fits.argmax())
        got = int(fits[w])
        if only is not None and got < need:
            names = ", ".join(occ.ix.switches[w] for w in only)
            raise NoRoomNow(f"no switch of {names} can take all {need} GPUs under it now")
        if got <= 0:
            raise NoRoomNow(_no_room(occ, pool, need, True))
        ids = pool.stayers(w, got)
        used.append(w)
        placed += ids
        if len(placed) >= n:
            return placed, used
        occ._hold_all(ids, _PLANNING)  # `rest`: the pool without them
        stay[w] = 0


def _place_steps(occ: Occupancy, pool, n: int, fixed: bool, original: dict[int, int],
                 only: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """`_place`, step by step: each step's switch weighed by the pool (`best`), its GPUs put under it (`_assign`)."""
    placed: list[int] = []
    used: list[int] = []
    barred = [] if only is None else [w for w in range(len(occ.ix.switches)) if w not in only]
    while len(placed) < n:
        need = n - len(placed)
        best = pool.best(occ, need, fixed, used + barred)
        if only is not None and (best is None or best[0] < need):
            names = ", ".join(occ.ix.switches[w] for w in only)
            raise NoRoomNow(f"no switch of {names} can take all {need} GPUs under it now")
        if best is None:
            raise NoRoomNow(_no_room(occ, pool, need, fixed))
        fits, _, w = best
        ids = _assign(occ, pool, w, fits, original)
        used.append(w)
        placed += ids
        if len(placed) < n:
            pool = pool.rest(occ, ids)
    return placed, used


def _no_room(occ: Occupancy, pool, need: int, fixed: bool) -> str:
    if fixed:
        return f"{need} more free GPUs with circuits are needed (the fixed policy keeps the cabling)"
    if pool.fixed_set:
        names = ", ".join(occ.ix.gpus[gi] for gi in sorted(pool.ids))
        return f"no free downlink can take {names} (every switch port is held by other jobs)"
    return f"no switch has a free downlink for {need} more GPUs (every switch port is held by other jobs)"

"""Occupancy's bulk holds and frees (`_hold_all`, `_free_all`, used by `release`, `take_over` and the planner's
`_Models.rest`) must leave every index as the one-GPU-at-a-time changes do, set contents and iteration order included
(the planner reads idle GPUs and downlinks in set order)."""

from __future__ import annotations

import random

import pytest

from controller.core.circuits import CircuitMap
from controller.core.occupancy import Occupancy
from simulator.inputs.racks import RackOptions, generate


def _scrambled(seed: int) -> Occupancy:
    rack = generate(RackOptions(64, gpus_per_switch=8, gpus_per_server=4, oversubscription=4, spare=1.5))
    occ = Occupancy(rack, CircuitMap.initial(rack), {})
    rng, ix = random.Random(seed), occ.ix
    for _ in range(40):
        gi = rng.randrange(len(ix.gpus))
        g, w = ix.gpu_group[gi], rng.randrange(len(ix.switches))
        if ix.downlinks[w][g]:
            occ.move(gi, rng.choice(ix.downlinks[w][g]))
    return occ


def _state(occ: Occupancy) -> tuple:
    def sets(x):
        return [sets(v) for v in x] if isinstance(x, list) else list(x) if isinstance(x, set) else x

    return (sets(occ.free_under), sets(occ.free_at), sets(occ.wired_free), sets(occ.idle), sets(occ.free_loose),
            occ.n_under.tolist(), occ.n_stay.tolist(), occ.n_open.tolist(), occ.n_wired.tolist(), occ.n_idle.tolist(),
            occ.n_loose.tolist(), list(occ.free_switch), sets(occ.free_wired), list(occ.free_model), list(occ.holder),
            {j: list(ids) for j, ids in occ.jobs.items()})


@pytest.mark.parametrize("seed", range(30))
def test_bulk_hold_and_free_match_one_by_one(seed: int):
    bulk, single = _scrambled(seed), _scrambled(seed)
    rng = random.Random(1000 + seed)
    n = len(bulk.ix.gpus)
    free = list(range(n))
    rng.shuffle(free)
    jobs: list[str] = []
    for step in range(40):
        if jobs and rng.random() < 0.4:
            job = jobs.pop(rng.randrange(len(jobs)))
            bulk.release(job)
            for gi in list(single.jobs[job]):
                single._unhold(gi)
            free = [gi for gi in range(n) if single.holder[gi] is None]
            rng.shuffle(free)
        else:
            k = rng.randint(0, min(12, len(free)))
            ids, free = free[:k], free[k:]
            job = f"j{step}"
            bulk._hold_all(ids, job)
            for gi in ids:
                single._hold(gi, job)
            if ids:
                jobs.append(job)
        assert _state(bulk) == _state(single)


@pytest.mark.parametrize("seed", range(10))
def test_bulk_hold_inside_a_tentative_change_is_undone_as_one_by_one(seed: int):
    bulk, single = _scrambled(seed), _scrambled(seed)
    ids = random.Random(seed).sample(range(len(bulk.ix.gpus)), 20)
    before = _state(bulk)
    with bulk.tentative(), single.tentative():
        bulk._hold_all(ids, "~planning")
        for gi in ids:
            single._hold(gi, "~planning")
        assert _state(bulk) == _state(single) != before
    assert _state(bulk) == _state(single)

"""The planner weighs every switch at once (controller/core/pools.py `_best`, numpy); it must choose what weighing
them one by one in order chooses (`totals`, `_cost`), on occupancies of every kind."""

from __future__ import annotations

import random

import pytest

from controller.core import pools
from controller.core.circuits import CircuitMap
from controller.core.occupancy import Occupancy
from simulator.inputs.racks import RackOptions, generate


def one_by_one(pool, occ, need, fixed, used):
    best = None
    for w in range(len(occ.ix.switches)):
        if w in used:
            continue
        fits, cost = pools._cost(need, *pool.totals(occ, w, fixed))
        if fits and (best is None or fits > best[0] or (fits == best[0] and cost < best[1])):
            best = (fits, cost, w)
    return best


def scrambled(seed: int) -> Occupancy:
    """A rack whose circuits were moved at random (some GPUs loose) and about half of whose GPUs are held."""
    rack = generate(RackOptions(64, gpus_per_switch=8, gpus_per_server=4, oversubscription=4, spare=1.5))
    occ = Occupancy(rack, CircuitMap.initial(rack), {})
    rng, ix = random.Random(seed), occ.ix
    for _ in range(40):
        gi = rng.randrange(len(ix.gpus))
        g = ix.gpu_group[gi]
        w = rng.randrange(len(ix.switches))
        if ix.downlinks[w][g]:
            occ.move(gi, rng.choice(ix.downlinks[w][g]))
    for gi in rng.sample(range(len(ix.gpus)), 30):
        occ._hold(gi, f"job{gi % 5}")
    for gi in rng.sample(range(len(ix.gpus)), 6):
        if occ.loc[gi] >= 0:
            occ._disconnect(gi)
    return occ


@pytest.mark.parametrize("seed", range(8))
def test_every_switch_at_once_chooses_as_one_by_one(seed):
    occ = scrambled(seed)
    rng = random.Random(seed)
    free = [gi for gi in range(len(occ.ix.gpus)) if occ.holder[gi] is None]
    for fixed in (False, True):
        for need in (1, 3, 8, 13):
            for used in ([], [0], [1, 3]):
                models = pools._Models(occ, [0] if seed % 2 else [0, 1])
                assert models.best(occ, need, fixed, used) == one_by_one(models, occ, need, fixed, used)
                named = pools._Named(occ, rng.sample(free, min(need, len(free))))
                assert named.best(occ, need, fixed, used) == one_by_one(named, occ, need, fixed, used)
    # the arrays kept beside the sets agree with them
    ix = occ.ix
    for w in range(len(ix.switches)):
        for g in range(len(ix.groups)):
            assert occ.n_empty[w, g] == len(occ.empty[w][g]) and occ.n_idle[w, g] == len(occ.idle[w][g])
            assert [occ.n_under[w, g, m] for m in range(len(ix.models))] == [len(s) for s in occ.free_under[w][g]]
        assert occ.free_switch[w] == sum(len(s) for per in occ.free_under[w] for s in per)
    for g in range(len(ix.groups)):
        assert occ.n_loose[g].tolist() == [len(s) for s in occ.free_loose[g]]
        assert occ.n_wired[g].tolist() == occ.free_wired[g]

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


class _OneByOne(Occupancy):
    """The journal as it was: `_hold_all` journals one `_unhold` per GPU held, `_unhold_all` is `_unhold` of each."""

    def _hold_all(self, ids, job):
        ids, journal = list(ids), self._journal
        self._journal = None
        try:
            super()._hold_all(ids, job)
        finally:
            self._journal = journal
        if journal is not None:
            journal.extend((self._unhold, gi) for gi in ids)

    def _unhold_all(self, ids):
        for gi in ids:
            self._unhold(gi)


def _ordered(occ: Occupancy) -> tuple:
    return _state(occ), list(occ.jobs), list(occ.partner)


def _pair(seed: int, cls) -> Occupancy:
    rack = generate(RackOptions(64, gpus_per_switch=8, gpus_per_server=4, oversubscription=4, spare=1.5))
    occ = cls(rack, CircuitMap.initial(rack), {})
    rng, ix = random.Random(seed), occ.ix
    for _ in range(40):
        gi = rng.randrange(len(ix.gpus))
        g, w = ix.gpu_group[gi], rng.randrange(len(ix.switches))
        if ix.downlinks[w][g]:
            occ.move(gi, rng.choice(ix.downlinks[w][g]))
    free = rng.sample(range(len(ix.gpus)), 40)
    for i in range(5):
        occ._hold_all(free[8 * i: 8 * i + 8], f"job{i}")
    return occ


@pytest.mark.parametrize("seed", range(20))
def test_bulk_journal_entries_undo_as_one_entry_per_gpu(seed: int):
    """Inside a tentative change, `_hold_all`'s one journal entry and `_unhold_all`'s one per run of a job's GPUs
    leave, change by change and after the rollback, what one entry per GPU (`_unhold`, `_hold`) left: every index, set
    iteration orders, the jobs' lists and their order (a rollback does not restore a list's order: as before)."""
    a, b = _pair(seed, Occupancy), _pair(seed, _OneByOne)
    rng, ix = random.Random(seed), a.ix
    assert _ordered(a) == _ordered(b)
    kinds = set()
    with a.tentative(), b.tentative():
        for step in range(30):
            kind = rng.choice(["hold", "unhold", "unhold", "move", "one"])
            if kind == "hold":
                free = [gi for gi in range(len(ix.gpus)) if a.holder[gi] is None]
                ids = rng.sample(free, min(len(free), rng.randrange(0, 9)))
                job = rng.choice(sorted(a.jobs) + [f"new{step}"])
                for occ in (a, b):
                    occ._hold_all(ids, job)
            elif kind == "unhold" and a.jobs:
                held = [gi for gi in range(len(ix.gpus)) if a.holder[gi] is not None]
                jobs = rng.sample(sorted(a.jobs), min(2, len(a.jobs)))
                ids = [gi for j in jobs for gi in a.jobs[j]]
                if rng.random() < 0.5:
                    rng.shuffle(ids)
                if rng.random() < 0.3:
                    ids = rng.sample(held, min(len(held), 6))  # several jobs' GPUs, interleaved, some jobs left
                for occ in (a, b):
                    occ._unhold_all(list(ids))
            elif kind == "move":
                gi, w = rng.randrange(len(ix.gpus)), rng.randrange(len(ix.switches))
                if ix.downlinks[w][ix.gpu_group[gi]]:
                    d = rng.choice(ix.downlinks[w][ix.gpu_group[gi]])
                    for occ in (a, b):
                        occ.move(gi, d)
            elif kind == "one" and a.jobs:
                gi = rng.choice([gi for gi in range(len(ix.gpus)) if a.holder[gi] is not None])
                for occ in (a, b):
                    occ._unhold(gi)
            kinds.add(kind)
            assert _ordered(a) == _ordered(b), (step, kind)
    assert _ordered(a) == _ordered(b)
    assert {"hold", "unhold"} <= kinds


@pytest.mark.parametrize("seed", range(3))
def test_defragmentation_plans_and_leaves_the_same_with_bulk_entries(seed: int):
    """plan_defrag (its movers' GPUs unheld by `_unhold_all`, its holds undone by one entry each) gives the plan, and
    leaves the occupancy (set orders and the jobs' lists included), that one journal entry per GPU gave."""
    from controller.core import placement
    from controller.core.defrag import plan_defrag

    rack = generate(RackOptions(256, gpus_per_switch=16, gpus_per_server=4, oversubscription=4, spare=1.5))
    rng = random.Random(seed)
    a, b = Occupancy(rack, CircuitMap.initial(rack), {}), _OneByOne(rack, CircuitMap.initial(rack), {})
    moved = 0
    for i in range(120):
        req = placement.Request(rng.choice([2, 4, 6, 8, 12, 20, 24]), rng.choice(["fixed", "regroup"]))
        try:
            plans = [placement.plan(occ, req, f"j{i}") for occ in (a, b)]
            assert plans[0] == plans[1]
        except placement.NoRoomNow:
            pass
        if rng.random() < 0.45 and a.jobs:
            job = rng.choice(sorted(a.jobs))
            for occ in (a, b):
                occ.release(job)
        if i % 10 == 9:
            jobs = {j: [a.ix.gpus[gi] for gi in v] for j, v in a.jobs.items()}
            got, want = plan_defrag(a, jobs), plan_defrag(b, jobs)
            assert got == want
            assert _ordered(a) == _ordered(b)
            moved += len(got.moves)
            if got.moves:
                for occ in (a, b):
                    occ.apply(got.remove, got.add)
    assert moved

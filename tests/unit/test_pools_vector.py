"""The planner weighs every switch at once (controller/core/pools.py `_best`, numpy); it must choose what weighing
them one by one in order chooses (`totals`, `_cost`), on occupancies of every kind."""

from __future__ import annotations

import random

import numpy as np
import pytest

from controller.core import placement, placing, pools
from controller.core.circuits import CircuitMap
from controller.core.defrag import plan_defrag
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
@pytest.mark.parametrize("first", [1, 3, pools._FIRST])
def test_every_switch_at_once_chooses_as_one_by_one(seed, first, monkeypatch):
    monkeypatch.setattr(pools, "_FIRST", first)  # the bound sets switches aside after 1, 3 or 8 weighed in full
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
        assert occ.n_stay[w].tolist() == occ.n_under[w].sum(axis=0).tolist()
        assert occ.free_at[w] == [set().union(*(per[m] for per in occ.free_under[w])) for m in range(len(ix.models))]
        assert occ.n_bare[w] == sum(len(occ.empty[w][g]) for g in range(len(ix.groups)))
        assert occ.n_open[w] == sum(len(occ.empty[w][g]) + len(occ.idle[w][g]) for g in range(len(ix.groups)))
    for g in range(len(ix.groups)):
        assert occ.n_loose[g].tolist() == [len(s) for s in occ.free_loose[g]]
        assert occ.n_wired[g].tolist() == occ.free_wired[g]
        assert occ.wired_free[g] == [set().union(*(occ.free_under[w][g][m] for w in range(len(ix.switches))))
                                     for m in range(len(ix.models))]



@pytest.mark.parametrize("shape", [(64, 8, 1.5), (96, 4, 2.0)])
def test_the_bound_weighs_in_full_what_could_win(shape, monkeypatch):
    """The planner that weighs in full only the switches whose bound could win (`_bounded`, one weighed before the
    bound sets others aside) chooses what weighing every switch (`_best`) chooses, ties included, in states from idle
    to busy, some GPUs loose."""
    monkeypatch.setattr(pools, "_FIRST", 1)
    gpus, per_switch, spare = shape
    rack = generate(RackOptions(gpus, gpus_per_switch=per_switch, gpus_per_server=4, oversubscription=4, spare=spare))
    for seed in range(10):
        rng = random.Random(seed)
        occ = Occupancy(rack, CircuitMap.initial(rack), {})
        ix = occ.ix
        for _ in range(rng.randrange(200)):
            gi, w = rng.randrange(len(ix.gpus)), rng.randrange(len(ix.switches))
            if ix.downlinks[w][ix.gpu_group[gi]]:
                occ.move(gi, rng.choice(ix.downlinks[w][ix.gpu_group[gi]]))
        for gi in rng.sample(range(len(ix.gpus)), int(rng.random() * len(ix.gpus))):
            occ._hold(gi, "job")
        for gi in rng.sample(range(len(ix.gpus)), rng.randrange(len(ix.gpus) // 3)):
            if occ.loc[gi] >= 0 and occ.holder[gi] is None:
                occ._disconnect(gi)
        for models in ([0], [1], [0, 1]):
            pool = pools._Models(occ, models)
            under = occ.n_under[:, :, models].sum(axis=2)
            for need in range(1, 20):
                for used in ([], [0], rng.sample(range(len(ix.switches)), 3)):
                    full = pools._best(occ, need, False, used, under, under, pool.n_loose, pool.n_wired)
                    assert pool.best(occ, need, False, used) == full, (seed, models, need, used)


def state(occ: Occupancy) -> tuple:
    """Everything an occupancy keeps, sets as sets."""
    return (occ.partner, occ.holder, occ.loc, occ.jobs, occ.empty, occ.idle, occ.free_under, occ.free_loose,
            occ.free_at, occ.wired_free, occ.free_wired, occ.free_model, occ.free_switch, occ.circuits,
            *(a.tolist() for a in (occ.n_under, occ.n_empty, occ.n_idle, occ.n_loose, occ.n_wired, occ.n_stay,
                                   occ.n_open, occ.n_bare)))


@pytest.mark.parametrize("seed", range(4))
def test_a_plan_committed_as_made_leaves_what_commit_after_it_leaves(seed):
    """plan(..., job) keeps the planner's own changes instead of undoing and making them again (occ.commit): the
    same plan and the same occupancy, job after job, some of them spread over switches, of either model or mixed."""
    rng = random.Random(seed)
    a, b = scrambled(seed), scrambled(seed)
    for i in range(12):
        req = placement.Request(rng.choice([1, 2, 3, 5, 8, 12]), rng.choice(["regroup", "regroup", "fixed"]),
                                rng.choice([None, None, "V100"]))
        try:
            want = placement.plan(a, req)
        except placement.NoRoomNow:
            with pytest.raises(placement.NoRoomNow):
                placement.plan(b, req, f"new{i}")
            assert state(b) == state(a)
            continue
        a.commit(f"new{i}", want)
        assert placement.plan(b, req, f"new{i}") == want
        assert state(b) == state(a)
        if rng.random() < 0.3:
            a.release(f"job{i % 5}"), b.release(f"job{i % 5}")


def _state(occ: Occupancy) -> tuple:
    return (list(occ.holder), {j: list(v) for j, v in occ.jobs.items()}, occ.n_under.tolist(), occ.n_stay.tolist(),
            occ.n_open.tolist(), occ.n_idle.tolist(), occ.n_loose.tolist(), occ.n_wired.tolist(), occ.free_model,
            occ.free_switch, occ.free_under, occ.free_at, occ.free_loose, occ.wired_free, occ.idle)


@pytest.mark.parametrize("seed", range(4))
def test_a_plan_handed_over_to_its_job_leaves_what_release_and_hold_leave(seed):
    """Occupancy.take_over (a placement's GPUs, some held by the planner, passed to the job) gives the state that
    releasing the planner's and holding all of them for the job gives; a GPU another job holds is refused, nothing
    changed."""
    a, b = scrambled(seed), scrambled(seed)
    rng, ix = random.Random(seed), a.ix
    free = [gi for gi in range(len(ix.gpus)) if a.holder[gi] is None]
    planned, rest = free[:5], free[5:9]
    for occ in (a, b):
        for gi in planned:
            occ._hold(gi, pools._PLANNING)
    names = [ix.gpus[gi] for gi in rng.sample(planned + rest, len(planned + rest))]
    a.take_over(pools._PLANNING, "job", names)
    b.release(pools._PLANNING)
    b.hold("job", names)
    assert _state(a) == _state(b)
    taken = next(gi for gi in range(len(ix.gpus)) if a.holder[gi] not in (None, "job"))
    for occ in (a, b):
        occ._hold(free[9], pools._PLANNING)
    before = _state(a)
    with pytest.raises(ValueError, match="is held by"):
        a.take_over(pools._PLANNING, "job2", [ix.gpus[free[9]], ix.gpus[taken]])
    assert _state(a) == before


def _orders(occ: Occupancy) -> tuple:
    """The state with every set as the list its iteration gives (the same operations in the same order leave the
    same order), and the count arrays the memoryviews write to."""
    def listed(x):
        return [listed(v) for v in x] if isinstance(x, list) else list(x) if isinstance(x, set) else x

    return (_state(occ), [listed(getattr(occ, a)) for a in ("empty", "idle", "free_under", "free_loose", "free_at",
                                                             "wired_free")], occ.n_empty.tolist(), occ.n_bare.tolist())


@pytest.mark.parametrize("seed", range(6))
def test_release_in_bulk_leaves_what_unhold_one_by_one_leaves(seed):
    """Occupancy.release (a job's GPUs freed without taking each off its list) leaves the state, and every set's
    iteration order, that `_unhold` of each GPU in the order the job took them leaves; inside a tentative change it
    is undone as before."""
    a, b = scrambled(seed), scrambled(seed)
    rng = random.Random(seed)
    for i in range(6):
        free = [gi for gi in range(len(a.ix.gpus)) if a.holder[gi] is None]
        taken = rng.sample(free, min(len(free), rng.randrange(1, 9)))
        for occ in (a, b):
            occ.hold(f"new{i}", [occ.ix.gpus[gi] for gi in taken])
    for job in rng.sample(sorted(a.jobs), len(a.jobs)):
        for gi in list(b.jobs[job]):
            b._unhold(gi)
        a.release(job)
        assert _orders(a) == _orders(b) and job not in a.jobs
        before = a.holders()
        for occ in (a, b):  # the same on both: a rollback leaves them equal again
            with occ.tentative():
                occ.release(next(iter(occ.jobs), "none"))
        assert a.holders() == before and _orders(a) == _orders(b)


@pytest.mark.parametrize("seed", range(4))
def test_the_first_switch_with_need_under_it_wins_unweighed(seed, monkeypatch):
    """Where a switch not used yet has `need` of the pool's idle GPUs under it, `_bounded` returns the first such
    switch at no change without weighing any (`_tiers` not called), and that is what weighing every switch gives."""
    occ = scrambled(seed)
    pool = pools._Models(occ, [0, 1])
    stay = occ.n_stay.sum(axis=1)
    hits = 0
    for need in range(1, 9):
        for used in ([], [int(stay.argmax())], [0, 1, 2]):
            under = occ.n_under.sum(axis=2)
            full = pools._best(occ, need, False, used, under, under, pool.n_loose, pool.n_wired)
            first = [w for w in range(len(stay)) if stay[w] >= need and w not in used]
            if first:
                hits += 1
                with monkeypatch.context() as m:
                    m.setattr(pools, "_tiers", None)  # weighing any switch fails
                    assert pool.best(occ, need, False, used) == (need, 0, first[0]) == full
            else:
                assert pool.best(occ, need, False, used) == full
    assert hits


@pytest.mark.parametrize("seed", range(6))
def test_a_fixed_plan_takes_no_pool_counts_and_is_the_counted_pool_s(seed, monkeypatch):
    """The fixed policy's pools leave their loose and wired counts per group untaken (`counted` False: reading one
    raises): job after job, committed or not, the same plan, the same error and the same occupancy as with pools
    that take them (as before), of either model or mixed, over several switches."""
    rng = random.Random(seed)
    a, b = scrambled(seed), scrambled(seed)
    counted = pools._Models

    def always_counted(occ, models, _counted=True):
        return counted(occ, models, True)

    seen = 0
    for i in range(24):
        req = placement.Request(rng.choice([1, 2, 3, 5, 8, 12, 20]), "fixed", rng.choice([None, None, "V100"]))
        job = f"new{i}" if rng.random() < 0.7 else None
        with monkeypatch.context() as m:
            m.setattr(pools, "_Models", always_counted)
            m.setattr(placement, "_Models", always_counted)
            try:
                want = placement.plan(b, req, job)
            except placement.NoRoomNow as e:
                want = e
        try:
            got = placement.plan(a, req, job)
        except placement.NoRoomNow as e:
            assert isinstance(want, placement.NoRoomNow) and str(e) == str(want)
        else:
            assert got == want
            seen += len(got.switches) > 1
        assert state(a) == state(b)
        if rng.random() < 0.3:
            a.release(f"new{i - 1}"), b.release(f"new{i - 1}")
    assert seen  # some plans spread over several switches (more than one step)
    pool = pools._Models(a, [0], counted=False)
    with pytest.raises(AttributeError):
        pool.n_loose  # noqa: B018


def _named_in_full(occ, pool, need, fixed, used):
    """`_Named.best` as it was: every switch weighed (`_best`) from the pool's GPUs and idle ones under each switch."""
    under, idle_under = np.zeros(occ.n_idle.shape, dtype=np.int64), np.zeros(occ.n_idle.shape, dtype=np.int64)
    for w, per in pool.under.items():
        for g, ids in per.items():
            under[w, g] = len(ids)
    for w, per in pool.idle_under.items():
        for g, k in per.items():
            idle_under[w, g] = k
    return pools._best(occ, need, fixed, used, under, idle_under, pool.n_loose, pool.n_wired)


@pytest.mark.parametrize("shape", [(64, 8, 1.5), (96, 4, 2.0)])
def test_a_named_pool_weighs_in_full_only_what_could_win(shape, monkeypatch):
    """A named pool whose GPUs under a switch are all idle (defragmentation's movers) is weighed by `_bounded` (one
    switch weighed before the bound sets others aside): the choice of weighing every switch, ties included, in states
    from idle to busy, some of the pool's GPUs loose; a pool with a held GPU is weighed in full as before."""
    monkeypatch.setattr(pools, "_FIRST", 1)
    gpus, per_switch, spare = shape
    rack = generate(RackOptions(gpus, gpus_per_switch=per_switch, gpus_per_server=4, oversubscription=4, spare=spare))
    bounded = held = 0
    for seed in range(10):
        rng = random.Random(seed)
        occ = Occupancy(rack, CircuitMap.initial(rack), {})
        ix = occ.ix
        for _ in range(rng.randrange(200)):
            gi, w = rng.randrange(len(ix.gpus)), rng.randrange(len(ix.switches))
            if ix.downlinks[w][ix.gpu_group[gi]]:
                occ.move(gi, rng.choice(ix.downlinks[w][ix.gpu_group[gi]]))
        for gi in rng.sample(range(len(ix.gpus)), int(rng.random() * len(ix.gpus))):
            occ._hold(gi, "job")
        for gi in rng.sample(range(len(ix.gpus)), rng.randrange(len(ix.gpus) // 3)):
            if occ.loc[gi] >= 0 and occ.holder[gi] is None:
                occ._disconnect(gi)
        free = [gi for gi in range(len(ix.gpus)) if occ.holder[gi] is None]
        taken = [gi for gi in range(len(ix.gpus)) if occ.holder[gi] is not None and occ.loc[gi] >= 0]
        for need in range(1, 20):
            ids = rng.sample(free, min(need, len(free)))
            if taken and rng.random() < 0.2:
                ids[-1:] = [rng.choice(taken)]
            pool = pools._Named(occ, ids)
            bounded += pool.all_idle
            held += not pool.all_idle
            for used in ([], [0], rng.sample(range(len(ix.switches)), 3)):
                for fixed in (False, True):
                    want = _named_in_full(occ, pool, len(ids), fixed, used)
                    assert pool.best(occ, len(ids), fixed, used) == want, (seed, need, used, fixed)
    assert bounded > 100 and held


@pytest.mark.parametrize("seed", range(3))
def test_defragmentation_plans_the_same_with_the_bound(seed, monkeypatch):
    """plan_defrag with the named pools weighed by `_bounded` gives the plan that weighing every switch gives: the
    same moves, circuits, kept jobs and switch counts, on racks made fragmented by jobs placed and ended at random."""
    rack = generate(RackOptions(256, gpus_per_switch=16, gpus_per_server=4, oversubscription=4, spare=1.5))
    rng = random.Random(seed)
    occ = Occupancy(rack, CircuitMap.initial(rack), {})
    moved = 0
    for i in range(120):
        req = placement.Request(rng.choice([2, 4, 6, 8, 12, 20, 24]), rng.choice(["fixed", "regroup"]))
        try:
            placement.plan(occ, req, f"j{i}")
        except placement.NoRoomNow:
            pass
        if rng.random() < 0.45 and occ.jobs:
            occ.release(rng.choice(sorted(occ.jobs)))
        if i % 10 == 9:
            jobs = {j: [occ.ix.gpus[gi] for gi in v] for j, v in occ.jobs.items()}
            got = plan_defrag(occ, jobs)
            with monkeypatch.context() as m:
                m.setattr(pools._Named, "best", lambda self, occ, need, fixed, used:
                          _named_in_full(occ, self, need, fixed, used))
                want = plan_defrag(occ, jobs)
            assert got == want
            moved += len(got.moves)
    assert moved


@pytest.mark.parametrize("seed", range(8))
def test_a_fixed_placement_from_one_copy_of_the_counts_is_the_step_by_step_one(seed, monkeypatch):
    """The fixed policy's placement reading each step's switch from one copy of the counts (`_place_fixed`) gives,
    request after request (either model or mixed, committed or not, some confined to a few switches, releases between),
    the plans, NoRoomNow errors and occupancy (set orders included) of weighing each step (`_place_steps`: `best`,
    `_assign`, `rest`, as before); some plans spread over several switches."""
    rng = random.Random(seed)
    a, b = scrambled(seed), scrambled(seed)
    names = a.ix.switches
    spread = errors = 0
    for i in range(40):
        only = tuple(rng.sample(names, 3)) if rng.random() < 0.25 else None
        req = placement.Request(rng.choice([1, 2, 3, 5, 8, 12, 20, 30]), "fixed", rng.choice([None, None, "V100"]),
                                switches=only)
        job = f"new{i}" if rng.random() < 0.7 else None
        with monkeypatch.context() as m:
            m.setattr(placing, "_place_fixed",
                      lambda occ, pool, n, only: placing._place_steps(occ, pool, n, True, {}, only))
            try:
                want = placement.plan(b, req, job)
            except placement.NoRoomNow as e:
                want = e
        try:
            got = placement.plan(a, req, job)
        except placement.NoRoomNow as e:
            assert isinstance(want, placement.NoRoomNow) and str(e) == str(want)
            errors += 1
        else:
            assert got == want
            spread += len(got.switches) > 1
        assert _orders(a) == _orders(b)
        if rng.random() < 0.3:
            a.release(f"new{i - 1}"), b.release(f"new{i - 1}")
    assert spread and errors


def _rows_one_by_one(pool, occ, w):
    """_Models.rows as it was: each group's `_split` from the sets' sizes, group by group."""
    under = occ.free_under[w]
    rows = []
    for g in pool.groups:
        s = sum(len(under[g][m]) for m in pool.models)
        rows.append((g, *pools._split(pool.n_loose[g], pool.n_wired[g] - s, len(occ.empty[w][g]),
                                      len(occ.idle[w][g]) - s)))
    return rows


@pytest.mark.parametrize("shape", [(64, 8, 1.5), (96, 4, 2.0)])
def test_a_switch_s_rows_from_the_counts_are_the_group_by_group_ones(shape):
    """_Models.rows (each group's movers at cost 1, 2 and 3 for a switch) computed for all the pool's groups at once
    from the occupancy's counts: the list of (group, n1, n2, n3), Python integers, that `_split` group by group gives,
    for every switch, pools of either model or both, in states from idle to busy, some GPUs loose; all three tiers
    met."""
    gpus, per_switch, spare = shape
    rack = generate(RackOptions(gpus, gpus_per_switch=per_switch, gpus_per_server=4, oversubscription=4, spare=spare))
    tiers = [0, 0, 0]
    for seed in range(10):
        rng = random.Random(seed)
        occ = Occupancy(rack, CircuitMap.initial(rack), {})
        ix = occ.ix
        for _ in range(rng.randrange(200)):
            gi, w = rng.randrange(len(ix.gpus)), rng.randrange(len(ix.switches))
            if ix.downlinks[w][ix.gpu_group[gi]]:
                occ.move(gi, rng.choice(ix.downlinks[w][ix.gpu_group[gi]]))
        for gi in rng.sample(range(len(ix.gpus)), int(rng.random() * len(ix.gpus))):
            occ._hold(gi, "job")
        for gi in rng.sample(range(len(ix.gpus)), rng.randrange(len(ix.gpus) // 3)):
            if occ.loc[gi] >= 0 and occ.holder[gi] is None:
                occ._disconnect(gi)
        for models in ([0], [1], [0, 1]):
            pool = pools._Models(occ, models)
            for w in range(len(ix.switches)):
                got = pool.rows(occ, w)
                assert got == _rows_one_by_one(pool, occ, w), (seed, models, w)
                assert all(type(x) is int for row in got for x in row)
                for row in got:
                    for t in range(3):
                        tiers[t] += row[t + 1] > 0
    assert all(tiers)

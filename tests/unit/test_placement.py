"""Placement: policies on the paper rack, GPU models on mixed racks, and invariants on random racks."""
import random

import pytest

from controller.core.circuits import CircuitMap, check_circuits
from controller.core.occupancy import Occupancy
from controller.core.placement import (
    InvalidRequest,
    NoRoomNow,
    PlacementError,
    Request,
    fragmentation,
    plan,
    plan_regroup,
)
from controller.core.rack import load_rack
from controller.core.rackgen import generate
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)
INITIAL = CircuitMap.initial(RACK)
RED = ("gpu1", "gpu2", "gpu3", "gpu4")


def occ(rack=RACK, circuits=None, **holders) -> Occupancy:
    """An occupancy; keyword arguments are jobs and their GPUs: job1=["gpu1", ...]."""
    held = {g: job for job, gpus in holders.items() for g in gpus}
    return Occupancy(rack, circuits if circuits is not None else CircuitMap.initial(rack), held)


def _frozen(x):
    if isinstance(x, (list, tuple)):
        return tuple(_frozen(y) for y in x)
    return frozenset(x) if isinstance(x, set) else x


def snapshot(o: Occupancy):
    """Every index of `o`, by value."""
    return _frozen([o.circuits, o.holder, o.loc, o.empty, o.idle, o.free_under, o.free_loose, o.free_wired,
                    o.free_model, sorted((j, sorted(v)) for j, v in o.jobs.items())])


def switches(o: Occupancy, p, gpus=None):
    after = p.target(o.circuits).gpu_locations(o.rack)
    return {after[g][0] for g in (gpus or p.gpus)}


def test_fixed_keeps_the_cabling_and_orders_ranks_by_switch():
    p = plan(occ(), Request(RED, "fixed"))
    assert p.changes == 0 and p.switches == ("as1", "as2")
    assert p.gpus == ("gpu1", "gpu2", "gpu3", "gpu4")  # as1's two, then as2's two: the ring crosses twice


def test_fixed_by_count_takes_one_model_under_the_fewest_switches():
    o = occ()
    p = plan(o, Request(2, "fixed"))
    assert p.gpus == ("gpu1", "gpu2") and p.switches == ("as1",) and p.changes == 0  # both M40 under as1
    p = plan(o, Request(4, "fixed"))
    assert set(p.gpus) == set(RED) and p.switches == ("as1", "as2")  # only M40 has four


def test_fixed_refuses_gpus_without_circuits():
    bare = CircuitMap([c for c in INITIAL.circuits if RACK.gpu_port("gpu4") not in c])
    with pytest.raises(PlacementError, match="gpu4 has no circuit"):
        plan(occ(circuits=bare), Request(RED, "fixed"))


def test_regroup_uses_fewest_changes_and_leaves_other_jobs_alone():
    o = occ(blue=["gpu5", "gpu6"])
    before = snapshot(o)
    p = plan(o, Request(RED))
    assert snapshot(o) == before  # planning changes nothing
    assert len(p.switches) == 1 and switches(o, p) == set(p.switches)
    assert p.changes == 4  # two GPUs move: two circuits down, two up
    target = p.target(INITIAL)
    for g in ("gpu5", "gpu6"):  # the other job's circuits are untouched
        assert target.partner(RACK.gpu_port(g)) == INITIAL.partner(RACK.gpu_port(g))
    check_circuits(RACK, list(target.circuits))


def test_regroup_of_a_grouped_job_changes_nothing():
    p = plan(occ(), Request(("gpu1", "gpu2")))
    assert p.changes == 0 and p.switches == ("as1",)


def test_regroup_falls_back_to_fewest_switches_and_says_so():
    rack = _trimmed(3)  # three downlinks a switch, and another job holds one of each
    circuits = CircuitMap([c for c in INITIAL.circuits if c[1].port in (11, 12, 13, 21, 22, 23)])
    p = plan(occ(rack, circuits, other=["gpu5", "gpu6"]), Request(RED))
    assert len(p.switches) == 2 and "no single aggregator switch" in p.note


def _trimmed(downlinks: int):
    """The paper rack with only the first `downlinks` downlinks on each switch."""
    data = RACK.spec.model_dump(mode="json")
    for w in data["switches"]:
        w["downlinks"] = w["downlinks"][:downlinks]
    data["circuits"] = []
    return type(RACK)(type(RACK.spec).model_validate(data))


def test_regroup_fails_clearly_when_no_downlink_is_free():
    rack = _trimmed(2)
    circuits = CircuitMap.parse(rack, [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:21"],
                                       ["ocs1:4", "ocs1:22"]])
    o = occ(rack, circuits, other=list(RED))  # gpu5 and gpu6 are free, every downlink is held
    with pytest.raises(NoRoomNow, match="no switch has a free downlink for 2 more GPUs"):
        plan(o, Request(2))
    with pytest.raises(NoRoomNow, match="no free downlink can take gpu5"):
        plan(o, Request(("gpu5",)))
    with pytest.raises(NoRoomNow, match="gpu1 is held by other"):
        plan(o, Request(("gpu1",)))


def test_bad_requests():
    o = occ()
    with pytest.raises(InvalidRequest, match="unknown policy") as info:
        plan(o, Request(2, "random"))
    assert info.value.field == "policy"
    with pytest.raises(PlacementError, match="7 GPUs asked for, the rack has 6"):
        plan(o, Request(7))
    with pytest.raises(InvalidRequest, match="unknown GPU gpu42"):
        plan(o, Request(("gpu42",)))
    with pytest.raises(
        InvalidRequest, match=r"unknown GPU model 'X100' on rack paper \(models here: M40, TitanV\)"
    ) as info:
        plan(o, Request(2, gpu_model="X100"))
    assert info.value.field == "gpu_model"
    with pytest.raises(InvalidRequest, match="no 'V100' GPUs on rack paper"):
        plan(o, Request(2, gpu_model="V100"))
    with pytest.raises(PlacementError, match="gpu5 is a TitanV, not M40") as info:  # well-formed: 409, not 400
        plan(o, Request(("gpu1", "gpu5"), gpu_model="M40"))
    assert not isinstance(info.value, InvalidRequest) and info.value.field == "gpu_model"
    with pytest.raises(PlacementError, match="3 x TitanV asked for, the rack has 2"):
        plan(o, Request(3, gpu_model="TitanV"))


# --- mixed-model racks -----------------------------------------------------------------------------
# 16 GPUs: s1 and s3 hold V100s (g1-g4, g9-g12), s2 and s4 M40s (g5-g8, g13-g16); two OCS; four
# aggregators of four downlinks each (two per OCS), cabled server by server: a1 g1-g4, a2 g5-g8, ...
MIXED = generate(16, gpus_per_server=4, switches=4, ocs=2, models=("V100", "M40"))


def models_of(p):
    return [MIXED.gpus[g].model for g in p.gpus]


def test_the_issues_case_an_8_gpu_job_gets_one_model():
    p = plan(occ(MIXED), Request(8))
    assert models_of(p) == ["V100"] * 8  # V100 is faster than M40 for vgg16
    assert len(p.switches) == 2 and p.changes == 0  # four downlinks a switch: two switches is the least
    assert "8 x V100" in p.note and "one model" in p.note


def test_homogeneous_set_under_the_fewest_switches_then_the_fastest():
    p = plan(occ(MIXED, other=["g1", "g2", "g3"]), Request(4))  # a3's four V100s are free
    assert models_of(p) == ["V100"] * 4 and p.switches == ("a3",) and p.changes == 0
    # four V100s free (g4, g10-g12), but three sit on one OCS: no switch can take them all
    p = plan(occ(MIXED, other=["g1", "g2", "g3", "g9"]), Request(4))
    assert models_of(p) == ["M40"] * 4 and p.switches == ("a2",)  # fewest switches before speed
    # five V100s free under a1 and a3, neither with room: under a2 they go, cutting idle M40s' circuits
    p = plan(occ(MIXED, other=["g1", "g9", "g10"]), Request(4))
    assert models_of(p) == ["V100"] * 4 and p.switches == ("a2",) and p.changes == 12
    p = plan(occ(MIXED, other=["g1", "g2", "g3"]), Request(6))  # V100 has 5 free, M40 8: one model
    assert models_of(p) == ["M40"] * 6 and len(p.switches) == 2


def test_a_job_naming_a_model_gets_only_that_model_or_no_room():
    o = occ(MIXED, other=["g5", "g6"])
    p = plan(o, Request(6, gpu_model="M40"))
    assert models_of(p) == ["M40"] * 6 and "gpu_model M40 asked for" in p.note
    with pytest.raises(NoRoomNow, match=r"7 x M40 asked for, 6 free \(free: V100 8, M40 6\)"):
        plan(o, Request(7, gpu_model="M40"))
    p = plan(o, Request(2, "fixed", gpu_model="M40"))
    assert models_of(p) == ["M40"] * 2 and p.switches == ("a2",) and p.changes == 0


def test_mixed_set_whose_slowest_gpu_is_fastest():
    rack = generate(24, gpus_per_server=4, switches=3, ocs=2, models=("A100", "V100", "M40"), spare=2)
    a100, v100, m40 = ([g for g in rack.gpus if rack.gpus[g].model == m] for m in ("A100", "V100", "M40"))
    o = occ(rack, other=a100[:4] + v100[:5] + m40[:2])  # free: A100 4, V100 3, M40 6
    p = plan(o, Request(7))  # no model has 7; A100 + V100 make 7 without an M40
    assert sorted(rack.gpus[g].model for g in p.gpus) == ["A100"] * 4 + ["V100"] * 3
    assert "no model has 7 free" in p.note and "on V100" in p.note
    p = plan(o, Request(9))  # needs M40s: the slowest is M40 whatever the mix
    assert "M40" in {rack.gpus[g].model for g in p.gpus}
    p = plan(o, Request(6))  # M40 alone has 6: one model beats a faster mix
    assert {rack.gpus[g].model for g in p.gpus} == {"M40"}
    with pytest.raises(NoRoomNow, match="14 GPUs asked for, 13 free"):
        plan(o, Request(14))


def test_regroup_of_a_running_job_and_when_it_cannot_gain():
    o = occ(red=list(RED), blue=["gpu5", "gpu6"])
    p = plan_regroup(o, RED)
    assert p.gpus == RED and len(p.switches) == 1 and p.changes == 4  # ranks kept
    assert switches(o, p, RED) == set(p.switches)
    assert plan_regroup(o, ["gpu5"]).note == "already under one switch"
    full = occ(_trimmed(3), INITIAL, red=list(RED), blue=["gpu5", "gpu6"])  # every downlink is taken
    p = plan_regroup(full, RED)
    assert p.changes == 0 and p.note == "cannot fall below 2 switches"


def test_fragmentation_report():
    assert fragmentation(occ())["largest_job_one_switch"] == 6
    f = fragmentation(occ(job=["gpu1", "gpu3"]))
    assert f["largest_job_one_switch"] == 4 and f["free_gpus"] == 4
    assert f["largest_by_model"] == {"M40": 2, "TitanV": 2} and f["free_by_model"] == {"M40": 2, "TitanV": 2}
    f = fragmentation(occ(MIXED))
    assert f["largest_job_one_switch"] == 4 and f["largest_by_model"]["V100"] == 4


# --- invariants on random racks and states ----------------------------------------------------------
def _brute_changes(o: Occupancy, gpus) -> int:
    """The fewest changes that put `gpus` (idle) under one switch, counted directly per switch and group."""
    rack, best = o.rack, None
    ix = o.ix
    for w in ix.switches:
        cost, ok = 0, True
        for g in range(len(ix.groups)):
            mine = [x for x in gpus if ix.gpu_group[ix.gpu_id[x]] == g]
            movers = [x for x in mine if o.switch_of(x) != w]
            downs = [ix.ports[d] for d in ix.downlinks[ix.switch_id[w]][g]]
            empty = [d for d in downs if o.circuits.partner(d) is None]
            idle = [
                d
                for d in downs
                if o.circuits.partner(d) is not None
                and o.holder[ix.gpu_id[rack.gpu_at(o.circuits.partner(d))]] is None
                and rack.gpu_at(o.circuits.partner(d)) not in gpus
            ]
            if len(movers) > len(empty) + len(idle):
                ok = False
                break
            cost += sum(1 + (o.switch_of(x) is not None) for x in movers) + max(0, len(movers) - len(empty))
        if ok and (best is None or cost < best):
            best = cost
    return best


@pytest.mark.parametrize("seed", range(40))
def test_random_states_keep_every_invariant(seed):
    rng = random.Random(seed)
    rack = generate(
        32,
        gpus_per_server=4,
        switches=4,
        ocs=rng.choice([1, 2]),
        spare=rng.choice([1.0, 1.5]),
        models=rng.choice([("V100",), ("V100", "M40"), ("A100", "V100", "M40")]),
    )
    circuits = CircuitMap.initial(rack)
    o = Occupancy(rack, circuits)
    for j in range(rng.randrange(1, 6)):  # some jobs, placed by the planner itself
        try:
            p = plan(o, Request(rng.randrange(1, 9), rng.choice(["fixed", "regroup"])))
        except NoRoomNow:
            continue
        o.commit(f"j{j}", p)
    assert Occupancy(rack, o.circuits, o.holders()).free_model == o.free_model  # incremental == rebuilt
    before, held = snapshot(o), o.holders()
    n = rng.randrange(1, 12)
    model = rng.choice([None, *o.ix.models])
    try:
        p = plan(o, Request(n, gpu_model=model))
    except NoRoomNow:
        return
    except PlacementError as e:
        assert "the rack has" in str(e) and n > o.ix.model_count[o.ix.model_id[model]]
        return
    assert snapshot(o) == before
    assert len(p.gpus) == n and not set(p.gpus) & set(held)
    assert model is None or {rack.gpus[g].model for g in p.gpus} == {model}
    target = p.target(o.circuits)
    check_circuits(rack, list(target.circuits))
    for g, job in held.items():  # no running job's circuit moved
        assert target.partner(rack.gpu_port(g)) == o.circuits.partner(rack.gpu_port(g)), job
    where = target.gpu_locations(rack)
    assert {where[g][0] for g in p.gpus} == set(p.switches)
    assert p.changes == len(o.circuits.diff(target).remove) + len(o.circuits.diff(target).add)
    if len(p.switches) == 1:  # the fewest changes, checked by brute force, for the GPUs it chose
        assert p.changes == _brute_changes(o, p.gpus)
    named = plan(o, Request(tuple(p.gpus)))
    if len(named.switches) == 1:
        assert named.changes == _brute_changes(o, p.gpus)


@pytest.mark.parametrize(
    "gpus,kw",
    [(64, dict(switches=8)), (256, dict(switches=16, ocs=2)), (1024, dict(switches=32, ocs=4, gpus_per_server=8))],
)
def test_regroup_on_generated_racks(gpus, kw):
    rack = generate(gpus, spare=1.5, **kw)
    o = Occupancy(rack, CircuitMap.initial(rack))
    rng = random.Random(gpus)
    cap = len(rack.spec.switches[0].downlinks) // kw.get("ocs", 1)  # downlinks per switch on one OCS
    for i, size in enumerate((cap // 2, cap // 3, cap // 4, 2)):  # each grouped without touching the others
        job = rng.sample([g for g in rack.gpus if o.holder[o.ix.gpu_id[g]] is None], size)
        p = plan(o, Request(tuple(job)))
        assert len(p.switches) == 1, p.note
        assert switches(o, p) == set(p.switches)
        held = o.holders()
        o.apply(p.remove, p.add)
        o.hold(f"j{i}", p.gpus)
        assert all(o.circuits.partner(rack.gpu_port(g)) is not None for g in held)


def test_a_job_larger_than_any_switch_spreads_over_the_fewest():
    rack = generate(64, switches=8, spare=1.5)
    cap = len(rack.spec.switches[0].downlinks)
    p = plan(occ(rack), Request(tuple(list(rack.gpus)[: cap + 1])))
    assert len(p.switches) == 2 and "no single aggregator switch has room" in p.note

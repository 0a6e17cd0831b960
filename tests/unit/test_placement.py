"""Placement policies, on the paper rack and on generated racks up to 1,024 GPUs."""
import random

import pytest

from controller.core.circuits import CircuitMap
from controller.core.placement import PlacementError, pick_gpus, plan, plan_fixed, plan_regroup
from controller.core.rack import load_rack
from controller.core.rackgen import generate
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)
INITIAL = CircuitMap.initial(RACK)
RED = ["gpu1", "gpu2", "gpu3", "gpu4"]


def switches(rack, circuits, gpus):
    where = circuits.gpu_locations(rack)
    return {where[g][0] for g in gpus}


def test_fixed_keeps_the_cabling_and_orders_ranks_by_switch():
    p = plan_fixed(RACK, INITIAL, RED)
    assert p.target == INITIAL and p.changes == 0
    assert p.switches == ("as1", "as2")
    assert p.gpus == ("gpu1", "gpu2", "gpu3", "gpu4")  # as1's two, then as2's two: the ring crosses twice
    assert pick_gpus(RACK, INITIAL, [], 4, "fixed") == ["gpu1", "gpu5", "gpu2", "gpu3"]


def test_fixed_refuses_gpus_without_circuits():
    bare = CircuitMap([c for c in INITIAL.circuits if RACK.gpu_port("gpu4") not in c])
    with pytest.raises(PlacementError, match="gpu4 has no circuit"):
        plan_fixed(RACK, bare, RED)


def test_regroup_uses_fewest_changes_and_leaves_other_jobs_alone():
    blue = ["gpu5", "gpu6"]
    protected = {RACK.gpu_port(g) for g in blue}
    p = plan_regroup(RACK, INITIAL, RED, protected)
    assert len(p.switches) == 1 and switches(RACK, p.target, RED) == set(p.switches)
    assert p.changes == 4  # two GPUs move: two circuits down, two up
    for g in blue:  # the other job's circuits are untouched
        assert p.target.partner(RACK.gpu_port(g)) == INITIAL.partner(RACK.gpu_port(g))
    d = INITIAL.diff(p.target)
    assert not ({q for c in d.remove | d.add for q in c} & (protected | {INITIAL.partner(x) for x in protected}))


def test_regroup_of_a_grouped_job_changes_nothing():
    p = plan_regroup(RACK, INITIAL, ["gpu1", "gpu2"])
    assert p.changes == 0 and p.target == INITIAL


def test_regroup_falls_back_to_fewest_switches_and_says_so():
    # other jobs hold four downlinks of each switch: two free each, a job of 4 needs two switches
    data = RACK.spec.model_dump(mode="json")
    for w in data["switches"]:
        w["downlinks"] = w["downlinks"][:3]
    rack = type(RACK)(type(RACK.spec).model_validate(data))
    circuits = CircuitMap([c for c in INITIAL.circuits if c[1].port in (11, 12, 13, 21, 22, 23)])
    other = {rack.gpu_port(g) for g in ("gpu5", "gpu6")}
    p = plan_regroup(rack, circuits, ["gpu1", "gpu2", "gpu3", "gpu4"], other)
    assert len(p.switches) == 2 and "no single aggregator switch" in p.note


def test_regroup_fails_clearly_when_nothing_is_free():
    everything = {d for w in RACK.aggregators() for d in RACK.downlink_ports(w)}  # held by other jobs
    with pytest.raises(PlacementError, match="no free downlink"):
        plan_regroup(RACK, CircuitMap(), RED, everything)


def test_plan_dispatch_and_unknown_policy():
    assert plan(RACK, INITIAL, RED, "fixed").changes == 0
    with pytest.raises(PlacementError, match="unknown policy"):
        plan(RACK, INITIAL, RED, "random")
    with pytest.raises(PlacementError, match="7 GPUs asked for, 6 free"):
        pick_gpus(RACK, INITIAL, [], 7, "regroup")


@pytest.mark.parametrize("gpus,kw", [(64, dict(switches=8)), (256, dict(switches=16, ocs=2)),
                                     (1024, dict(switches=32, ocs=4, gpus_per_server=8))])
def test_regroup_on_generated_racks(gpus, kw):
    rack = generate(gpus, spare=1.5, **kw)
    circuits = CircuitMap.initial(rack)
    rng = random.Random(gpus)
    busy: set[str] = set()
    protected: set = set()
    cap = len(rack.spec.switches[0].downlinks) // kw.get("ocs", 1)  # downlinks per switch on one OCS
    for size in (cap // 2, cap // 3, cap // 4, 2):  # several jobs, each grouped without touching the others
        job = rng.sample([g for g in rack.gpus if g not in busy], size)
        p = plan_regroup(rack, circuits, job, protected)
        assert len(p.switches) == 1, p.note
        assert switches(rack, p.target, job) == set(p.switches)
        for q in protected:
            assert p.target.partner(q) == circuits.partner(q)
        circuits = p.target
        busy |= set(job)
        protected |= {rack.gpu_port(g) for g in job}


def test_a_job_larger_than_any_switch_spreads_over_the_fewest():
    rack = generate(64, switches=8, spare=1.5)
    cap = len(rack.spec.switches[0].downlinks)
    p = plan_regroup(rack, CircuitMap.initial(rack), list(rack.gpus)[: cap + 1])
    assert len(p.switches) == 2 and "no single aggregator switch has room" in p.note

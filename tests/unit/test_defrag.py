"""Defragmentation (the joint regrouping of running jobs) and the iteration-time model behind its gain."""
import random

import pytest

from controller.core.circuits import CircuitMap, check_circuits
from controller.core.defrag import plan_defrag
from controller.core.occupancy import Occupancy
from controller.core.perf import iteration_seconds
from controller.core.placement import NoRoomNow, Request, plan, plan_regroup
from controller.core.rackgen import generate
from profiles import WORKLOADS, compute_seconds
from tests.unit.test_placement import INITIAL, RACK, RED, _trimmed, snapshot

BLUE = ("gpu5", "gpu6")


def jobs_occ(rack, circuits, **jobs):
    return Occupancy(rack, circuits, {g: j for j, gpus in jobs.items() for g in gpus})


def switch_count(rack, circuits, gpus):
    where = circuits.gpu_locations(rack)
    return len({where[g][0] for g in gpus})


def test_two_fragmented_jobs_each_end_under_one_switch():
    o = jobs_occ(RACK, INITIAL, red=RED, blue=BLUE)  # the paper's fragmented start: both span as1 and as2
    before = snapshot(o)
    d = plan_defrag(o, {"red": RED, "blue": BLUE})
    assert snapshot(o) == before
    assert (d.switches_before, d.switches_after) == (4, 2) and not d.kept
    target = INITIAL.apply(d.diff)
    check_circuits(RACK, list(target.circuits))
    assert switch_count(RACK, target, RED) == switch_count(RACK, target, BLUE) == 1
    assert {m.job for m in d.moves} == {"red", "blue"}
    assert d.changes == 6  # two GPUs of red and one of blue move: each cut and made, nothing idle touched
    assert d.remove == frozenset().union(*(m.remove for m in d.moves))
    assert d.add == frozenset().union(*(m.add for m in d.moves))


def test_a_joint_move_where_one_job_alone_cannot_gain():
    rack = _trimmed(4)  # four downlinks a switch
    circuits = CircuitMap.parse(rack, INITIAL.to_json())
    o = jobs_occ(rack, circuits, red=RED, blue=BLUE)
    assert plan_regroup(o, RED).note == "cannot fall below 2 switches"  # blue is in the way...
    d = plan_defrag(o, {"red": RED, "blue": BLUE})  # ...but moving both works
    target = circuits.apply(d.diff)
    assert d.switches_after == 2 and switch_count(rack, target, RED) == switch_count(rack, target, BLUE) == 1


def test_a_job_that_cannot_gain_is_untouched_and_a_grouped_one_too():
    rack = _trimmed(3)
    circuits = CircuitMap.parse(rack, INITIAL.to_json())
    o = jobs_occ(rack, circuits, red=RED, blue=BLUE)
    d = plan_defrag(o, {"red": RED, "blue": BLUE})
    assert not d.moves and not d.remove and not d.add
    assert d.kept == {"red": "cannot fall below 2 switches", "blue": "cannot fall below 2 switches"}
    grouped = jobs_occ(RACK, INITIAL, pair=("gpu1", "gpu2"), red2=("gpu3", "gpu5"))
    d = plan_defrag(grouped, {"pair": ("gpu1", "gpu2"), "red2": ("gpu3", "gpu5")})
    assert d.kept == {"pair": "already under one switch"} and [m.job for m in d.moves] == ["red2"]
    assert not {c for m in d.moves for c in m.remove} & {INITIAL.partner(RACK.gpu_port(g)) for g in ("gpu1", "gpu2")}


@pytest.mark.parametrize("seed", range(30))
def test_random_fragmented_racks(seed):
    rng = random.Random(seed)
    rack = generate(32, gpus_per_server=4, switches=4, ocs=rng.choice([1, 2]), spare=rng.choice([1.0, 1.5]),
                    models=rng.choice([("V100",), ("V100", "M40")]))
    o = Occupancy(rack, CircuitMap.initial(rack))
    jobs = {}
    for j in range(rng.randrange(2, 7)):
        free = [g for g in rack.gpus if o.holder[o.ix.gpu_id[g]] is None and o.switch_of(g)]
        if not free:
            break
        gpus = tuple(rng.sample(free, min(len(free), rng.randrange(1, 9))))  # scattered: fragmented
        try:
            p = plan(o, Request(gpus, "fixed"))
        except NoRoomNow:
            continue
        o.hold(f"j{j}", p.gpus)
        jobs[f"j{j}"] = p.gpus
    before = snapshot(o)
    d = plan_defrag(o, jobs)
    assert snapshot(o) == before
    circuits = o.circuits
    target = circuits.apply(d.diff)
    check_circuits(rack, list(target.circuits))
    moved = {m.job for m in d.moves}
    assert moved.isdisjoint(d.kept) and moved | set(d.kept) <= set(jobs)
    total = 0
    for j, gpus in jobs.items():
        n_before, n_after = switch_count(rack, circuits, gpus), switch_count(rack, target, gpus)
        total += n_after
        if j in moved:
            assert n_after < n_before
        else:  # not touched at all
            assert all(target.partner(rack.gpu_port(g)) == circuits.partner(rack.gpu_port(g)) for g in gpus)
    assert total == d.switches_after <= d.switches_before


def test_iteration_model_on_the_paper_rack():
    vgg = WORKLOADS["vgg16"]
    compute = compute_seconds("vgg16", "M40")
    ring = 2 * 3 / 4 * vgg.gradient_bytes * 8 / 100e9  # four ranks at 100 Gbit/s
    uplink = RACK.switches["as1"].uplinks[0].rate_gbps
    assert uplink < 50  # the paper rack's fitted uplink: narrower than two NICs' share of it
    jobs = {"red": RED, "blue": BLUE}
    where = {g: s for g, (s, _) in INITIAL.gpu_locations(RACK).items()}
    t = iteration_seconds(RACK, jobs, where, {"red": "vgg16", "blue": "vgg16"})
    # red and blue each cross the as1-as2 uplink once each way: two flows share it
    assert t["red"] == pytest.approx(compute + ring * 100 / (uplink / 2))
    grouped = dict(where, gpu3="as1", gpu4="as1")
    t = iteration_seconds(RACK, jobs, grouped, {"red": "vgg16", "blue": "vgg16"})
    assert t["red"] == pytest.approx(compute + ring)
    # blue still crosses the uplink, alone now: the uplink is its narrowest hop
    assert t["blue"] == pytest.approx(
        compute_seconds("vgg16", "TitanV") + 2 * 1 / 2 * vgg.gradient_bytes * 8 / (uplink * 1e9)
    )
    assert iteration_seconds(RACK, {"one": ("gpu1",)}, where, {})["one"] == pytest.approx(compute)

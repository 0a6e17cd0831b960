"""The placement app's orchestration with fake switches and a fake container driver, on virtual time: every thread of
the controller runs on tests/unit/virtual.py's runtime, and the wall clock's sleeps raise (the `vrt` fixture)."""
from __future__ import annotations

import pytest

from controller.apps.context import Conflict, Optirack
from controller.apps.fabric import FabricApp
from controller.apps.inventory import Inventory
from controller.apps.ocs import OcsApp
from controller.apps.placement import PlacementApp
from controller.core.circuits import CircuitMap
from controller.core.jobs import JobRequest
from controller.core.placement import InvalidRequest, NoRoomNow, PlacementError
from controller.core.rack import load_rack
from tests.unit.fakes import FakeDriver, FakeSwitch
from tests.unit.test_rack import PAPER
from tests.unit.virtual import VirtualRuntime

RACK = load_rack(PAPER)


def make(tmp_path, driver, rt):
    """A controller (its OCS, fabric and placement apps) on runtime `rt`; a second one on a new runtime is a
    restart (the first one's threads never run again)."""
    driver.sleep = rt.sleep
    for container in driver.running.values():  # a restart on the same engines: their workers go on
        container.sleep = rt.sleep
    ctx = Optirack(rack=RACK, state_dir=tmp_path, clock=rt.clock, runtime=rt)
    ocs_app = OcsApp(optirack=ctx)
    apps = [Inventory(optirack=ctx), ocs_app, FabricApp(optirack=ctx)]
    placement = PlacementApp(optirack=ctx, driver=driver)
    dps = [FakeSwitch(0x100, apps, rt=rt), FakeSwitch(0x201, apps, rt=rt), FakeSwitch(0x202, apps, rt=rt)]
    for dp in dps:
        dp.connect()
    rt.run(lambda: "ocs1" in ocs_app.synchronised and not ctx.lock.locked(), what="the OCS synchronised")
    return ctx, placement, dps[0]


def finished(placement, job_id):
    return lambda: not placement.get(job_id).active


def req(**kw) -> JobRequest:
    kw.setdefault("workload", {"iterations": 3})
    return JobRequest.model_validate(kw)


def test_regroup_job_runs_under_one_switch_and_frees_its_gpus(tmp_path, vrt):
    driver = FakeDriver()
    ctx, placement, ocs = make(tmp_path, driver, vrt)
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="regroup"))
    vrt.run(finished(placement, job.id), what="the job to end")
    assert job.state == "done", job.reason
    assert len(job.switches) == 1 and len(job.events) == 1
    assert {ctx.circuits.gpu_locations(RACK)[g][0] for g in job.gpus} == set(job.switches)
    assert job.completion_s() == pytest.approx(3.0)
    assert [g for _, g, _ in driver.started] == job.gpus  # one container per GPU, in rank order
    ranks = [cmd[cmd.index("--rank") + 1] for _, _, cmd in driver.started]
    assert ranks == ["0", "1", "2", "3"]
    assert sorted(g for _, g in driver.removed) == sorted(job.gpus)
    assert placement.busy_gpus() == {}
    assert ocs.circuits() == {(a.port, b.port) for a, b in ctx.circuits.circuits}  # circuits kept after the job


def test_fixed_job_keeps_the_cabling(tmp_path, vrt):
    ctx, placement, _ = make(tmp_path, FakeDriver(), vrt)
    before = ctx.circuits
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="fixed"))
    vrt.run(finished(placement, job.id))
    assert job.state == "done" and job.switches == ["as1", "as2"] and job.events == []
    assert ctx.circuits == before


def test_conflicting_requests_are_refused_when_they_may_not_wait(tmp_path, vrt):
    driver = FakeDriver(block=True)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    with pytest.raises(NoRoomNow, match="gpu1 is held by job-1; not queued"):
        placement.submit(req(gpus=["gpu1", "gpu3"], queue=False))
    with pytest.raises(NoRoomNow, match=r"5 GPUs asked for, 4 free \(free: M40 2, TitanV 2\)"):
        placement.submit(req(gpus=5, queue=False))
    with pytest.raises(NoRoomNow, match=r"3 x M40 asked for, 2 free \(free: M40 2, TitanV 2\)"):
        placement.submit(req(gpus=3, gpu_model="M40", queue=False))
    with pytest.raises(PlacementError, match=r"3 x TitanV asked for, the rack has 2"):
        placement.submit(req(gpus=3, gpu_model="TitanV"))
    with pytest.raises(PlacementError, match="7 GPUs asked for, the rack has 6"):
        placement.submit(req(gpus=7))  # never: refused even though it may wait
    with pytest.raises(InvalidRequest, match="unknown GPU gpu9"):
        placement.submit(req(gpus=["gpu9"]))
    with pytest.raises(InvalidRequest, match=r"unknown GPU model 'K80' on rack paper \(models here: M40, TitanV\)"):
        placement.submit(req(gpus=1, gpu_model="K80"))
    assert list(placement.jobs) == ["job-1"] and not placement.queue  # nothing else was admitted


def test_a_queued_job_starts_when_a_running_one_ends(tmp_path, vrt):
    driver = FakeDriver(block=True)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    first = placement.submit(req(gpus=4, gpu_model="M40"))
    vrt.run(lambda: first.state == "running")
    second = placement.submit(req(gpus=3))  # 2 free: waits
    third = placement.submit(req(gpus=1))  # would fit, but arrives later: first in, first out
    assert (second.state, second.position, third.state, third.position) == ("queued", 1, "queued", 2)
    assert "3 GPUs asked for, 2 free" in second.note and "1 queued job(s) ahead" in third.note
    assert placement.busy_gpus().keys() == set(first.gpus)
    placement.stop_job(first.id)
    vrt.run(lambda: second.state == "running" and third.state == "running", what="the queue to drain")
    assert second.position is None and len(second.gpus) == 3 and len(third.gpus) == 1
    assert not set(second.gpus) & set(third.gpus)
    fourth = placement.submit(req(gpus=4))
    assert fourth.state == "queued"
    placement.stop_job(fourth.id)
    assert fourth.state == "stopped" and fourth.reason == "stopped while queued" and not placement.queue
    for job in (second, third):
        placement.stop_job(job.id)


def test_new_jobs_avoid_a_server_whose_engine_is_down(tmp_path, vrt):
    driver = FakeDriver(block=True)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    down = RACK.server_of["gpu1"]
    on_down = {g for g, s in RACK.server_of.items() if s == down}
    driver.engines.down[down] = "connection refused"
    with pytest.raises(Conflict, match=f"the Docker Engine of server {down} is down .*gpu1 cannot run"):
        placement.submit(req(gpus=["gpu1"]))
    assert not placement.jobs  # refused, not queued
    job = placement.submit(req(gpus=len(RACK.gpus) - len(on_down)))
    vrt.run(lambda: job.state == "running")
    assert not set(job.gpus) & on_down
    waiting = placement.submit(req(gpus=1))  # the only free GPUs are on the server that is down
    assert waiting.state == "queued" and "1 GPUs asked for, 0 free" in waiting.note, waiting.note
    placement.stop_job(waiting.id)
    placement.stop_job(job.id)


def test_a_queued_job_survives_a_restart(tmp_path, vrt):
    ctx, placement, _ = make(tmp_path, FakeDriver(block=True), vrt)
    first = placement.submit(req(gpus=6))
    vrt.run(lambda: first.state == "running")
    waiting = placement.submit(req(gpus=2))
    assert waiting.state == "queued"
    rt2 = VirtualRuntime()  # a restart: the first controller's threads never run again
    ctx2, placement2, _ = make(tmp_path, FakeDriver(block=True), rt2)  # the first job's containers are gone
    rt2.run(lambda: placement2.get(waiting.id).state == "running", what="the queued job to start after the restart")
    assert placement2.get(first.id).state == "failed"
    placement2.stop_job(waiting.id)


def test_a_container_that_fails_to_start_rolls_everything_back(tmp_path, vrt):
    driver = FakeDriver(fail_start_on="gpu3")
    ctx, placement, ocs = make(tmp_path, driver, vrt)
    before = ctx.circuits
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="regroup"))
    vrt.run(finished(placement, job.id))
    assert job.state == "failed" and "no such image" in job.reason
    assert ctx.circuits == before  # the placement was undone
    assert ocs.circuits() == {(a.port, b.port) for a, b in before.circuits}
    assert len(job.events) == 2  # placed, then undone
    assert driver.running == {} and placement.busy_gpus() == {}


def test_a_failing_worker_fails_the_job_and_stops_the_others(tmp_path, vrt):
    driver = FakeDriver(exit_codes={"gpu2": 3})
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    vrt.run(finished(placement, job.id))
    assert job.state == "failed" and "gpu2 exited with 3" in job.reason


def test_stop_and_regroup_of_a_running_job(tmp_path, vrt):
    driver = FakeDriver(block=True)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="fixed"))
    vrt.run(lambda: job.state == "running")
    ev, note = placement.regroup_with_note(job.id)
    assert ev is not None and ev.kind == "regroup" and len(job.switches) == 1 and "under one switch" in note
    assert placement.regroup_with_note(job.id) == (None, "already under one switch")
    assert placement.regroup(job.id) is None
    stopped = placement.stop_job(job.id)
    assert stopped.state == "stopped" and placement.busy_gpus() == {}
    with pytest.raises(Conflict, match="only a running job"):
        placement.regroup(job.id)


def test_jobs_survive_a_restart(tmp_path, vrt):
    ctx, placement, _ = make(tmp_path, FakeDriver(), vrt)
    job = placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    vrt.run(finished(placement, job.id))
    ctx2, placement2, _ = make(tmp_path, FakeDriver(), VirtualRuntime())
    assert placement2.get(job.id).state == "done"
    assert placement2.get(job.id).completion_s() == pytest.approx(3.0)
    assert ctx2.circuits == ctx.circuits
    assert placement2.submit(req(gpus=["gpu1"], policy="fixed")).id == "job-2"


def test_job_request_validation():
    from pydantic import ValidationError
    for bad in ({"gpus": 0}, {"gpus": []}, {"gpus": ["gpu1", "gpu1"]}, {"gpus": 2, "policy": "random"},
                {"gpus": 2, "workload": {"model": "alexnet"}}, {"gpus": 2, "colour": "red"},
                {"gpus": 2, "workload": {"iterations": 0}}):
        with pytest.raises(ValidationError):
            JobRequest.model_validate(bad)
    assert CircuitMap.initial(RACK)


def test_defragmentation_dry_run_then_apply_that_plan(tmp_path, vrt):
    ctx, placement, ocs = make(tmp_path, FakeDriver(block=True), vrt)
    red = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="fixed", workload={"iterations": 10}))
    blue = placement.submit(req(gpus=["gpu5", "gpu6"], policy="fixed", workload={"iterations": 10}))
    vrt.run(lambda: red.state == blue.state == "running" and len(red.iterations()) == len(blue.iterations()) == 3,
               what="both jobs running, their fake workers' 3 iterations read")
    before, events, flows = ctx.circuits, len(ctx.events.recent()), dict(ocs.flows)
    plan = placement.regroup_all(dry_run=True)
    assert ctx.circuits == before and len(ctx.events.recent()) == events and ocs.flows == flows  # nothing changed
    assert plan["applied"] is False and plan["event"] is None and plan["version"] == ctx.circuits_version
    assert {m["job"] for m in plan["jobs_moved"]} == {red.id, blue.id}
    assert (plan["switches_before"], plan["switches_after"]) == (4, 2) and plan["expected_stall_s"] == 0.025
    for m in plan["jobs_moved"]:
        assert m["iteration_s_after"] < m["iteration_s_before"] and m["remaining_iterations"] == 7
    moved = f"the circuit map is at version {ctx.circuits_version}, the plan was made from version 99"
    with pytest.raises(Conflict, match=moved):
        placement.regroup_all(version=99)
    kept, placement.service._plans = placement.service._plans, {}  # as after a restart: the plan is forgotten
    with pytest.raises(Conflict, match=f"no plan was made from version {plan['version']}"):
        placement.regroup_all(version=plan["version"])
    placement.service._plans = kept
    done = placement.regroup_all(version=plan["version"])
    ev = done["event"]
    assert done["applied"] and ev["kind"] == "regroup" and ctx.circuits_version > plan["version"]
    assert sorted(ev["removed"]) == sorted(plan["circuits"]["remove"]) and sorted(ev["added"]) == sorted(
        plan["circuits"]["add"]
    )
    assert red.events == blue.events == [ev["id"]]  # one reconfiguration for both jobs
    assert len(red.switches) == len(blue.switches) == 1
    assert ocs.circuits() == {(a.port, b.port) for a, b in ctx.circuits.circuits}
    with pytest.raises(Conflict, match="the circuit map is at version"):
        placement.regroup_all(version=plan["version"])  # the map has moved on
    again = placement.regroup_all()
    assert again["event"] is None and not again["jobs_moved"]
    assert {u["reason"] for u in again["jobs_untouched"]} == {"already under one switch"}
    for job in (red, blue):
        placement.stop_job(job.id)


def test_a_plan_is_refused_if_the_jobs_changed(tmp_path, vrt):
    ctx, placement, _ = make(tmp_path, FakeDriver(block=True), vrt)
    red = placement.submit(req(gpus=["gpu1", "gpu3"], policy="fixed"))
    blue = placement.submit(req(gpus=["gpu5", "gpu6"], policy="fixed"))
    vrt.run(lambda: red.state == blue.state == "running")
    plan = placement.regroup_all(dry_run=True)
    placement.stop_job(blue.id)  # no circuit changes, but the plan would now differ
    with pytest.raises(Conflict, match="running jobs changed"):
        placement.regroup_all(version=plan["version"])
    placement.stop_job(red.id)


def _held_at_configuring(tmp_path, vrt, driver):
    """A regroup job stopped at configuring by the fault hook, its circuits and containers in place."""
    ctx, placement, ocs = make(tmp_path, driver, vrt)
    before = ctx.circuits
    placement.service.hold_configuring = True
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="regroup"))
    vrt.run(lambda: len(driver.started) == 4, what="the held job's containers")
    vrt.advance(5)
    assert job.state == "configuring" and ctx.circuits != before and len(job.circuits) == 4
    return before, job


def test_a_restart_carries_on_a_configuring_job_whose_circuits_and_containers_match(tmp_path, vrt):
    driver = FakeDriver(block=True)
    _, job = _held_at_configuring(tmp_path, vrt, driver)
    rt2 = VirtualRuntime()  # the controller died while the job was configuring; a new one starts
    ctx2, placement2, ocs2 = make(tmp_path, driver, rt2)
    again = placement2.get(job.id)
    rt2.run(lambda: again.state == "running", what="the configuring job to be carried on")
    assert len(driver.started) == 4 and driver.removed == []  # the same containers, adopted
    assert {frozenset(c) for c in again.circuits} <= {frozenset(map(str, c)) for c in ctx2.circuits.circuits}
    assert ocs2.circuits() == {(a.port, b.port) for a, b in ctx2.circuits.circuits}
    placement2.stop_job(job.id)
    assert again.state == "stopped" and driver.running == {}


def test_a_restart_undoes_a_configuring_job_whose_containers_are_gone(tmp_path, vrt):
    driver = FakeDriver(block=True)
    before, job = _held_at_configuring(tmp_path, vrt, driver)
    driver.running.pop(next(n for n in driver.running if n.endswith("gpu3")))  # lost while the controller was down
    rt2 = VirtualRuntime()
    ctx2, placement2, ocs2 = make(tmp_path, driver, rt2)
    again = placement2.get(job.id)
    rt2.run(lambda: not again.active, what="the configuring job to be undone")
    assert again.state == "failed" and "the containers of gpu3 are gone" in again.reason, again.reason
    assert ctx2.circuits == before  # its placement's circuits put back
    assert ocs2.circuits() == {(a.port, b.port) for a, b in before.circuits}
    assert driver.running == {} and placement2.busy_gpus() == {}  # nothing left on any engine
    assert [ctx2.events.get(e).reason for e in again.events][-1] == f"{job.id}: undo placement"

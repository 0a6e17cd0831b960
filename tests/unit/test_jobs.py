"""The job service built alone (no Ryu app): the rack state, a fake circuit-change port, a fake container driver, on
virtual time: every thread of the service runs on tests/unit/virtual.py's runtime, and the wall clock's sleeps raise
(the `vrt` fixture). The wiring of the apps is tested in test_apps.py."""
from __future__ import annotations

import pytest

from controller.core.circuits import CircuitMap
from controller.core.errors import Conflict
from controller.core.jobs import JobRequest
from controller.core.placement import InvalidRequest, NoRoomNow, PlacementError
from controller.core.rack import load_rack
from tests.unit.jobfakes import FakeDriver, service
from tests.unit.test_rack import PAPER
from tests.unit.virtual import VirtualRuntime

RACK = load_rack(PAPER)


def make(tmp_path, driver, rt):
    """The job service alone on runtime `rt`: (the rack state, the service, the circuit-change port); a second one on
    a new runtime is a restart (the first one's threads never run again)."""
    jobs, state, changes = service(tmp_path, RACK, driver, rt)
    rt.advance(0)  # its threads start: the restart's reconciling has run
    return state, jobs, changes


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
    assert list(placement.jobs) == ["job-1"] and not placement.book.queue  # nothing else was admitted


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
    placement.stop(first.id)
    vrt.run(lambda: second.state == "running" and third.state == "running", what="the queue to drain")
    assert second.position is None and len(second.gpus) == 3 and len(third.gpus) == 1
    assert not set(second.gpus) & set(third.gpus)
    fourth = placement.submit(req(gpus=4))
    assert fourth.state == "queued"
    placement.stop(fourth.id)
    assert fourth.state == "stopped" and fourth.reason == "stopped while queued" and not placement.book.queue
    for job in (second, third):
        placement.stop(job.id)


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
    placement.stop(waiting.id)
    placement.stop(job.id)


def test_a_queued_job_survives_a_restart(tmp_path, vrt):
    ctx, placement, _ = make(tmp_path, FakeDriver(block=True), vrt)
    first = placement.submit(req(gpus=6))
    vrt.run(lambda: first.state == "running")
    waiting = placement.submit(req(gpus=2))
    assert waiting.state == "queued"
    rt2 = VirtualRuntime()  # a restart: the first controller's threads never run again
    ctx2, placement2, _ = make(tmp_path, FakeDriver(block=True), rt2)  # the first job's containers are gone
    again = placement2.get(first.id)
    rt2.run(lambda: again.state == "running" and again.recoveries, what="the first job recovered after the restart")
    assert sorted(again.recoveries[-1]["restarted"]) == sorted(again.gpus)  # every worker went: each on its own GPU
    assert placement2.get(waiting.id).state == "queued" and placement2.get(waiting.id).position == 1
    placement2.stop(first.id)
    rt2.run(lambda: placement2.get(waiting.id).state == "running", what="the queued job to start after the first")
    placement2.stop(waiting.id)


def test_a_container_that_fails_to_start_rolls_everything_back(tmp_path, vrt):
    driver = FakeDriver(fail_start_on="gpu3")
    ctx, placement, ocs = make(tmp_path, driver, vrt)
    before = ctx.circuits
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="regroup"))
    vrt.run(finished(placement, job.id))
    assert job.state == "failed" and "no such image" in job.reason
    assert ctx.circuits == before  # the placement was undone
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
    ev, note = placement.regroup(job.id)
    assert ev is not None and ev.kind == "regroup" and len(job.switches) == 1 and "under one switch" in note
    assert placement.regroup(job.id) == (None, "already under one switch")
    stopped = placement.stop(job.id)
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
    before, events, len_made = ctx.circuits, len(ctx.events.recent()), len(ocs.made)
    plan = placement.regroup_all(dry_run=True)
    assert ctx.circuits == before and len(ctx.events.recent()) == events and not ocs.made[len_made:]  # nothing changed
    assert plan["applied"] is False and plan["event"] is None and plan["version"] == ctx.circuits_version
    assert {m["job"] for m in plan["jobs_moved"]} == {red.id, blue.id}
    assert (plan["switches_before"], plan["switches_after"]) == (4, 2) and plan["expected_stall_s"] == 0.025
    for m in plan["jobs_moved"]:
        assert m["iteration_s_after"] < m["iteration_s_before"] and m["remaining_iterations"] == 7
    moved = f"the circuit map is at version {ctx.circuits_version}, the plan was made from version 99"
    with pytest.raises(Conflict, match=moved):
        placement.regroup_all(version=99)
    kept, placement.regrouper._plans = placement.regrouper._plans, {}  # as after a restart: the plan is forgotten
    with pytest.raises(Conflict, match=f"no plan was made from version {plan['version']}"):
        placement.regroup_all(version=plan["version"])
    placement.regrouper._plans = kept
    done = placement.regroup_all(version=plan["version"])
    ev = done["event"]
    assert done["applied"] and ev["kind"] == "regroup" and ctx.circuits_version > plan["version"]
    assert sorted(ev["removed"]) == sorted(plan["circuits"]["remove"]) and sorted(ev["added"]) == sorted(
        plan["circuits"]["add"]
    )
    assert red.events == blue.events == [ev["id"]]  # one reconfiguration for both jobs
    assert len(red.switches) == len(blue.switches) == 1
    with pytest.raises(Conflict, match="the circuit map is at version"):
        placement.regroup_all(version=plan["version"])  # the map has moved on
    again = placement.regroup_all()
    assert again["event"] is None and not again["jobs_moved"]
    assert {u["reason"] for u in again["jobs_untouched"]} == {"already under one switch"}
    for job in (red, blue):
        placement.stop(job.id)


def test_a_plan_is_refused_if_the_jobs_changed(tmp_path, vrt):
    ctx, placement, _ = make(tmp_path, FakeDriver(block=True), vrt)
    red = placement.submit(req(gpus=["gpu1", "gpu3"], policy="fixed"))
    blue = placement.submit(req(gpus=["gpu5", "gpu6"], policy="fixed"))
    vrt.run(lambda: red.state == blue.state == "running")
    plan = placement.regroup_all(dry_run=True)
    placement.stop(blue.id)  # no circuit changes, but the plan would now differ
    with pytest.raises(Conflict, match="running jobs changed"):
        placement.regroup_all(version=plan["version"])
    placement.stop(red.id)


def _held_at_configuring(tmp_path, vrt, driver):
    """A regroup job stopped at configuring by the fault hook, its circuits and containers in place."""
    ctx, placement, ocs = make(tmp_path, driver, vrt)
    before = ctx.circuits
    placement.runs.hold_configuring = True
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
    placement2.stop(job.id)
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
    assert driver.running == {} and placement2.busy_gpus() == {}  # nothing left on any engine
    assert [ctx2.events.get(e).reason for e in again.events][-1] == f"{job.id}: undo placement"


def test_the_service_built_alone_runs_a_job_through_submit_regroup_a_loss_and_stop(tmp_path, vrt):
    """No Ryu app: the rack state, a fake circuit-change port, fake workers training on virtual time."""
    driver = FakeDriver(pace=1.0)
    state, jobs, changes = make(tmp_path, driver, vrt)
    gpus = ["gpu1", "gpu2", "gpu3", "gpu4"]
    job = jobs.submit(req(gpus=gpus, policy="fixed", workload={"iterations": 1000}, checkpoint_every=5))
    vrt.run(lambda: len(job.iterations()) >= 3, what="the job to run")
    assert job.switches == ["as1", "as2"] and changes.made == []
    ev, note = jobs.regroup(job.id)
    assert ev is changes.made[-1] and ev.kind == "regroup" and len(job.switches) == 1, note
    vrt.run(lambda: len(job.iterations()) >= 12, what="a checkpoint after the regroup")
    driver.kill_server("srv2")
    vrt.run(lambda: job.state == "recovering", what="the loss to be seen")
    vrt.run(lambda: job.state == "running" and job.recoveries, what="the spare swapped in")
    (rec,) = job.recoveries
    spare = rec["spares"]["gpu2"]
    assert "gpu2" not in job.gpus and spare in job.gpus and state.rack.server_of[spare] != "srv2"
    assert {state.circuits.gpu_locations(state.rack)[g][0] for g in job.gpus} == set(job.switches)
    assert rec["resumed_from"] == 10 and job.attempt == 1
    stopped = jobs.stop(job.id)
    assert stopped.state == "stopped" and jobs.busy_gpus() == {}
    assert [c.labels["gpu"] for c in driver.running.values()] == ["gpu2"]  # on the dead server: swept when it is back
    assert jobs.get(job.id) is job and jobs.list(10)[0] == [job]


def test_the_queue_records_when_it_granted_each_jobs_gpus(tmp_path, vrt):
    """admitted_at: at the submission for a job placed at once, at the drain for a queued one (in the queue's order),
    never for a job still queued; the trace replay compares the scheduler's order by it (evidence/tracecheck.py)."""
    ctx, placement, _ = make(tmp_path, FakeDriver(block=True), vrt)
    first = placement.submit(req(gpus=4, gpu_model="M40"))
    assert first.admitted_at == first.created_at == ctx.clock()
    vrt.run(lambda: first.state == "running")
    assert first.admitted_at <= first.started_at
    vrt.advance(5.0)
    second = placement.submit(req(gpus=3))
    third = placement.submit(req(gpus=1))
    assert second.admitted_at is None and third.admitted_at is None  # queued: nothing granted yet
    vrt.advance(5.0)
    stopped_at = ctx.clock()
    placement.stop(first.id)
    vrt.run(lambda: second.state == "running" and third.state == "running", what="the queue to drain")
    assert stopped_at <= second.admitted_at <= third.admitted_at <= third.started_at
    assert second.admitted_at >= second.created_at + 5.0
    assert placement.get(third.id).to_json()["admitted_at"] == third.admitted_at
    for job in (second, third):
        placement.stop(job.id)

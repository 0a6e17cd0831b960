"""The placement app's orchestration with fake switches and a fake container driver."""
from __future__ import annotations

import pytest

from controller.apps.context import Conflict, Optirack
from controller.apps.fabric import FabricApp
from controller.apps.inventory import Inventory
from controller.apps.ocs import OcsApp
from controller.apps.placement import PlacementApp
from controller.core.circuits import CircuitMap
from controller.core.jobs import JobRequest
from controller.core.rack import load_rack
from tests.unit.fakes import FakeDriver, FakeSwitch, wait_until
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)


def make(tmp_path, driver):
    ctx = Optirack(rack=RACK, state_dir=tmp_path)
    ocs_app = OcsApp(optirack=ctx)
    apps = [Inventory(optirack=ctx), ocs_app, FabricApp(optirack=ctx)]
    placement = PlacementApp(optirack=ctx, driver=driver)
    dps = [FakeSwitch(0x100, apps), FakeSwitch(0x201, apps), FakeSwitch(0x202, apps)]
    for dp in dps:
        dp.connect()
    wait_until(lambda: "ocs1" in ocs_app.synchronised and not ctx.lock.locked(), what="the OCS synchronised")
    return ctx, placement, dps[0]


def finished(placement, job_id):
    return lambda: not placement.get(job_id).active


def req(**kw) -> JobRequest:
    kw.setdefault("workload", {"iterations": 3})
    return JobRequest.model_validate(kw)


def test_regroup_job_runs_under_one_switch_and_frees_its_gpus(tmp_path):
    driver = FakeDriver()
    ctx, placement, ocs = make(tmp_path, driver)
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="regroup"))
    wait_until(finished(placement, job.id), what="the job to end")
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


def test_fixed_job_keeps_the_cabling(tmp_path):
    ctx, placement, _ = make(tmp_path, FakeDriver())
    before = ctx.circuits
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="fixed"))
    wait_until(finished(placement, job.id))
    assert job.state == "done" and job.switches == ["as1", "as2"] and job.events == []
    assert ctx.circuits == before


def test_conflicting_requests_are_refused(tmp_path):
    driver = FakeDriver(block=True)
    ctx, placement, _ = make(tmp_path, driver)
    placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    with pytest.raises(Conflict, match="gpu1 is held by job job-1"):
        placement.submit(req(gpus=["gpu1", "gpu3"]))
    with pytest.raises(Conflict, match="5 GPUs asked for, 4 free"):
        placement.submit(req(gpus=5))
    with pytest.raises(ValueError, match="unknown GPU gpu9"):
        placement.submit(req(gpus=["gpu9"]))


def test_a_container_that_fails_to_start_rolls_everything_back(tmp_path):
    driver = FakeDriver(fail_start_on="gpu3")
    ctx, placement, ocs = make(tmp_path, driver)
    before = ctx.circuits
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="regroup"))
    wait_until(finished(placement, job.id))
    assert job.state == "failed" and "no such image" in job.reason
    assert ctx.circuits == before  # the placement was undone
    assert ocs.circuits() == {(a.port, b.port) for a, b in before.circuits}
    assert len(job.events) == 2  # placed, then undone
    assert driver.running == {} and placement.busy_gpus() == {}


def test_a_failing_worker_fails_the_job_and_stops_the_others(tmp_path):
    driver = FakeDriver(exit_codes={"gpu2": 3})
    ctx, placement, _ = make(tmp_path, driver)
    job = placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    wait_until(finished(placement, job.id))
    assert job.state == "failed" and "gpu2 exited with 3" in job.reason


def test_stop_and_regroup_of_a_running_job(tmp_path):
    driver = FakeDriver(block=True)
    ctx, placement, _ = make(tmp_path, driver)
    job = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="fixed"))
    wait_until(lambda: job.state == "running")
    ev = placement.regroup(job.id)
    assert ev is not None and ev.kind == "regroup" and len(job.switches) == 1
    assert placement.regroup(job.id) is None  # already grouped
    stopped = placement.stop_job(job.id)
    assert stopped.state == "stopped" and placement.busy_gpus() == {}
    with pytest.raises(Conflict, match="only a running job"):
        placement.regroup(job.id)


def test_jobs_survive_a_restart(tmp_path):
    ctx, placement, _ = make(tmp_path, FakeDriver())
    job = placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    wait_until(finished(placement, job.id))
    ctx2, placement2, _ = make(tmp_path, FakeDriver())
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

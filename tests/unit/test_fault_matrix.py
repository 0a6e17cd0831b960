"""The fault matrix on virtual time: a recovery held at each of its persisted steps (the fault hook), a second fault
of each kind there, and the recovery let go: every cell ends `done`, every iteration once, its ranks on servers that
are up. The test rack (the paper's, six GPUs) has a spare for every cell: a 2-GPU job of M40s loses srv2 (gpu2) first,
then one of the faults below, and finds spares among the other M40s and the Titan Vs.

Faults: a survivor's worker killed (kill -9), its engine killed, its NIC's link down, its server hung (every process
stopped, nothing refused), a second server lost (the spare's, once one is chosen), and the controller killed (a new
one starts on the same state and engines, without the hook)."""
from __future__ import annotations

import pytest

from controller.jobs.inbox import Reconcile
from controller.jobs.recovery import STEPS
from tests.unit.jobfakes import FakeDriver, service
from tests.unit.test_jobs import RACK, finished, req
from tests.unit.virtual import VirtualRuntime

PACE = 1.0
FAULTS = ("worker killed", "engine killed", "link down", "server hung", "second server lost", "controller killed")


def _spare_server(job) -> str:
    """The server of the spare the recovery chose (or will take: srv4's M40, the last free one of its model)."""
    spare = (job.recovery or {}).get("spares", {}).get("gpu2")
    return RACK.server_of[spare] if spare else "srv4"


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("step", STEPS)
def test_a_second_fault_at_each_step_of_a_recovery_ends_done(tmp_path, vrt, step, fault):
    driver = FakeDriver(pace=PACE)
    jobs, state, _ = service(tmp_path, RACK, driver, vrt, keep_survivors=True)
    jobs.recovery.hold_at = step
    job = jobs.submit(req(gpus=["gpu1", "gpu2"], workload={"iterations": 30}, checkpoint_every=5))
    vrt.run(lambda: len(job.iterations()) >= 12, what="12 iterations")
    driver.kill_server("srv2")
    vrt.run(lambda: job.recovery is not None and job.recovery["step"] == step, what=f"the recovery held at {step}")
    vrt.advance(1.0)
    assert job.state == "recovering" and job.recovery["step"] == step, job.recovery
    rt = vrt
    if fault == "worker killed":
        driver.kill9(job.id, "gpu1", "srv1")
    elif fault == "engine killed":
        driver.kill_server("srv1")
    elif fault == "link down":
        jobs.link_changed(RACK.gpu_port("gpu1"), False)
    elif fault == "server hung":
        driver.hang_server("srv1")
    elif fault == "second server lost":
        driver.kill_server(_spare_server(job))
    if fault == "controller killed":
        rt = VirtualRuntime()  # killed at the held step; a new controller starts on the same state and engines
        jobs, state, _ = service(tmp_path, RACK, driver, rt, keep_survivors=True)
        job = jobs.get(job.id)
    else:
        jobs.recovery.hold_at = None  # let go
        jobs.inbox.post(Reconcile(job.id))
    rt.run(finished(jobs, job.id), what=f"the job to end ({fault} at {step})")
    assert job.state == "done", job.reason
    assert [i["iteration"] for i in job.iterations()] == list(range(30))
    down = set(driver.engines.down) | driver.engines.hung
    assert not {RACK.server_of[g] for g in job.gpus} & down, (job.gpus, down)
    if fault in ("engine killed", "server hung", "link down"):
        assert "gpu1" not in job.gpus  # the survivor's loss joined the recovery: it was swapped out
    assert jobs.busy_gpus() == {}
    if rt is not vrt:
        rt.close()

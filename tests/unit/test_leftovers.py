"""One owner for a GPU's leftovers at a time, on virtual time: after a restart, the sweep of a server and a new job's
start both find the old controller's warm spare on the GPU the new job was given. Whichever comes first, the other
waits for it (workers.owning) and finds the container gone: it is removed once, and the new job runs.

The fake engine here refuses a second removal of a container it is still removing, as Docker does (409 "removal of
container ... is already in progress"), so the test fails if the two ever remove it at once."""
from __future__ import annotations

import pytest

from controller.drivers.containers import container_name
from controller.jobs.inbox import Call
from controller.jobs.ports import ContainerError
from tests.unit.jobfakes import FakeDriver, service
from tests.unit.test_jobs import RACK, finished, req
from tests.unit.virtual import VirtualRuntime

PACE = 1.0  # virtual seconds per iteration of the fake workers
REMOVE_S = 2.0  # virtual seconds a container's removal takes (its NIC handed back, the worker and sandbox removed)


class SlowRemoval(FakeDriver):
    """Removal takes REMOVE_S; a removal of a container already being removed is refused as the engine refuses it; a
    container already gone is nothing to do (the real driver's removal is safe to repeat)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.removing: set[str] = set()
        self.refused: list[tuple[str, str]] = []
        self.gone: list = []  # the containers removed, themselves (a warm spare started again has the same name)

    def remove(self, job, gpu, server):
        name = container_name(job, gpu)
        if name in self.removing:
            self.refused.append((job, gpu))
            raise ContainerError(f'409 Conflict ("removal of container {name} is already in progress")')
        if name not in self.running:
            return
        self.removing.add(name)
        try:
            self.sleep(REMOVE_S)
            self.gone.append(self.running[name])
            super().remove(job, gpu, server)
        finally:
            self.removing.discard(name)


@pytest.mark.parametrize("first", ["sweep", "eviction"])
def test_a_restart_s_sweep_and_a_new_job_on_a_warm_spare_s_gpu_remove_it_once(tmp_path, vrt, first):
    driver = SlowRemoval(pace=PACE)
    old, _, _ = service(tmp_path, RACK, driver, vrt, keep_survivors=True)
    vrt.advance(0)
    running = old.submit(req(gpus=["gpu1", "gpu3"], policy="fixed", workload={"iterations": 200}))
    vrt.run(lambda: len(running.iterations()) >= 2 and len(old.book.warm) == 2 and len(driver.running) == 4,
            what="two warm spares")
    assert old.book.warm == {"gpu2": running.id, "gpu4": running.id}  # an M40 under each of its switches
    spare = container_name(running.id, "gpu2")
    old = {g: driver.running[container_name(running.id, g)] for g in ("gpu2", "gpu4")}  # the old controller's

    rt = VirtualRuntime()  # the controller is killed; a new one starts on the same state and engines
    jobs, _, _ = service(tmp_path, RACK, driver, rt, keep_survivors=True, start=False)
    if first == "sweep":
        jobs.start()  # the restart's reconciling, then its sweep of every server
        rt.run(lambda: spare in driver.removing, what="the sweep removing the warm spare on gpu2")
        new = jobs.submit(req(gpus=["gpu2", "gpu4"], policy="fixed", workload={"iterations": 3}))
    else:  # the restart's reconciling is slow to reach its sweep: the new job's start gets there first
        jobs.start(restart=False)
        new = jobs.submit(req(gpus=["gpu2", "gpu4"], policy="fixed", workload={"iterations": 3}))
        rt.run(lambda: spare in driver.removing, what="the new job removing the warm spare on gpu2")
        jobs.inbox.post(Call("restart.begin"))
    rt.run(finished(jobs, new.id), what="the new job to end")
    assert new.state == "done", new.reason
    assert driver.refused == []  # never two removals of one container at once
    assert [driver.gone.count(c) for c in old.values()] == [1, 1]  # each old warm spare removed once
    assert not [c for c in driver.running.values() if c.labels["gpu"] in ("gpu2", "gpu4")
                and c.labels["job"] == running.id]  # and none of the running job's left on the new job's GPUs
    adopted = jobs.get(running.id)
    assert adopted.state == "running" and adopted.gpus == ["gpu1", "gpu3"]  # adopted after the restart
    rt.close()

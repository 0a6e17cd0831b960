"""Faults in a job's life on the emulated rack, where the real parts matter: a worker killed (its GPU swapped for a
spare, the job going on from its checkpoint; with no spare of its model, restarted on its own GPU), a NIC that cannot
be handed over, an OCS bridge that refuses flows. Each of the last two ends failed with the reason, its GPUs free, no
container left on any engine, every NIC home, no event running, and the controller's circuits equal to the OCS
bridge's flows. (Faults that need a bug or a broken engine injected are unit tests: tests/unit/test_faults.py.)"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from controller.core.emulated import netns_of, nic_plans
from controller.core.rack import load_rack
from controller.drivers.containers import container_name
from controller.drivers.engines import engine_client
from emulation import netns as ns
from emulation import nics, ovs
from tests.integration.helpers import PAPER, assert_no_containers, sh, wait_for

RACK = load_rack(PAPER)
FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]
RED = ["gpu1", "gpu2", "gpu3", "gpu4"]
ACTIVE = "pending,configuring,running,recovering"




@pytest.fixture
def fragmented(bed):
    wait_for(lambda: not bed.client.get("/jobs", state=ACTIVE)["jobs"], 120, "earlier jobs to end")
    bed.client.put("/ocs/circuits", {"circuits": FRAGMENTED})
    yield bed.client
    for job in bed.client.get("/jobs", state=ACTIVE)["jobs"]:
        bed.client.delete(f"/jobs/{job['id']}")


def _device_map() -> list[list[str]]:
    return sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in ovs.circuits_of(ovs.circuit_flows("ocs1")))


def _ended(client, job_id: str, timeout: float = 180) -> dict:
    wait_for(
        lambda: client.get(f"/jobs/{job_id}")["job"]["state"] not in ACTIVE.split(","), timeout, f"{job_id} to end"
    )
    return client.get(f"/jobs/{job_id}")["job"]


def assert_clean(client, job: dict, reason: str, circuits: list[list[str]] | None = None) -> None:
    assert job["state"] == "failed" and reason in (job["reason"] or ""), (job["state"], job["reason"])
    assert all(g["job"] is None for g in client.get("/topology")["gpus"].values()), "GPUs still held"
    assert_no_containers()
    for gpu in RACK.gpus:
        assert ns.has_link(RACK.interface(gpu), netns_of(RACK.server_of[gpu])), f"the NIC of {gpu} is not home"
    def running() -> list[dict]:
        return [e for e in client.get("/events", limit=50)["events"] if e["status"] == "running"]

    try:  # a restore the OCS app started by itself (the bridge had room again, or reconnected) ends on its own
        wait_for(lambda: not running(), 30, "every circuit change to end", interval=0.5)
    except TimeoutError:
        pass  # the assertion shows it
    assert running() == [], running()
    held = client.get("/ocs/circuits")["circuits"]
    wait_for(lambda: _device_map() == held, 30, "the OCS bridge to hold the controller's circuits")
    if circuits is not None:
        assert held == sorted(circuits)


def _worker(job_id: str, gpu: str) -> tuple[str, int]:
    """The worker container of `gpu` on its server's engine: its id and its main process's host PID."""
    c = engine_client(RACK, RACK.server_of[gpu], 30).containers.get(container_name(job_id, gpu))
    return c.id, c.attrs["State"]["Pid"]


def _kill_gpu2_of_a_running_job(client, iterations: int, before: dict | None = None) -> dict:
    """A job on gpu1 and gpu2 (checkpoint every 3), once it has done 4 iterations: gpu2's container killed (kill -9).
    `before`: filled with gpu1's worker (container id, PID) just before the kill."""
    job = client.post(
        "/jobs",
        {"gpus": ["gpu1", "gpu2"], "policy": "fixed", "checkpoint_every": 3,
         "workload": {"iterations": iterations, "compute_seconds": 0.05}},
    )["job"]
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["iterations_done"] >= 4, 120, "the job to iterate")
    if before is not None:
        before["gpu1"] = _worker(job["id"], "gpu1")
    engine_client(RACK, RACK.server_of["gpu2"], 30).containers.get(f"optirack-{job['id']}-gpu2").kill()
    return job


def test_a_worker_killed_mid_job(fragmented):
    """kill -9 of one worker: its GPU is swapped for a spare and every rank goes on from the checkpoint; the
    survivor keeps its process (the same container and PID), leaves the broken ring and joins the new one, and the
    spare is the job's warm one (a worker already started there), handed its rank."""
    client = fragmented
    before: dict = {}
    job = _kill_gpu2_of_a_running_job(client, 100000, before)
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["recoveries"], 60, "the job to recover")
    rec = client.get(f"/jobs/{job['id']}")["job"]["recoveries"][0]
    assert set(rec["lost"]) == {"gpu2"} and "exited with 137" in rec["lost"]["gpu2"] and rec["resumed_from"] >= 3
    assert rec["kept"] == ["gpu1"] and _worker(job["id"], "gpu1") == before["gpu1"], rec
    assert rec["warm"] == {rec["spares"]["gpu2"]: True}, rec  # the job's warm spare was handed the rank
    detail = client.get(f"/jobs/{job['id']}")["job"]
    restored = {g: [r for r in detail["checkpoints"][g] if r["event"] == "restored"] for g in detail["gpus"]}
    assert [r["from"] for r in restored["gpu1"]] == ["memory"], restored  # its own state, kept in its process
    before = client.get(f"/jobs/{job['id']}")["job"]["iterations_done"]
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["iterations_done"] >= before + 2, 60, "it to go on")
    client.post(f"/jobs/{job['id']}/stop")
    done = _ended(client, job["id"])
    assert done["state"] == "stopped" and "gpu2" not in done["gpus"]
    assert_no_containers()
    for gpu in RACK.gpus:
        assert ns.has_link(RACK.interface(gpu), netns_of(RACK.server_of[gpu])), f"the NIC of {gpu} is not home"


def test_a_killed_worker_with_no_spare_of_its_model_is_restarted_on_its_own_gpu(fragmented):
    """SIGKILL of the process one worker's container runs, on a job of both Titan V (no spare of its model): its
    server and link live, so its rank starts again on its own GPU from the checkpoint and the job ends done."""
    client = fragmented
    job = client.post(
        "/jobs",
        {"gpus": ["gpu5", "gpu6"], "gpu_model": "TitanV", "policy": "fixed", "checkpoint_every": 3,
         "workload": {"iterations": 30, "compute_seconds": 0.05}},
    )["job"]

    def saved() -> bool:  # every rank's first checkpoint reported (its copy at the peer made)
        return all(any(r["event"] == "checkpoint" for r in rs)
                   for rs in client.get(f"/jobs/{job['id']}")["job"]["checkpoints"].values())

    wait_for(saved, 120, "a checkpoint of every rank")
    c = engine_client(RACK, RACK.server_of["gpu6"], 30).containers.get(container_name(job["id"], "gpu6"))
    pid = c.attrs["State"]["Pid"]
    assert "containers.worker" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    os.kill(pid, signal.SIGKILL)  # the worker's own process, by the PID its engine gives
    done = _ended(client, job["id"])
    assert done["state"] == "done" and done["iterations_done"] == 30, (done["state"], done["reason"])
    (rec,) = done["recoveries"]
    assert set(rec["restarted"]) == {"gpu6"} and "exited with 137" in rec["restarted"]["gpu6"], rec
    assert rec["spares"] == {} and done["gpus"] == ["gpu5", "gpu6"] and rec["resumed_from"] >= 3, rec
    detail = client.get(f"/jobs/{job['id']}")["job"]
    assert {r["attempt"] for r in detail["ranks"]["gpu6"]} == {0, 1}  # its rank before and after, on gpu6
    restored = [r["iteration"] for r in detail["checkpoints"]["gpu6"] if r["event"] == "restored"]
    assert restored == [rec["resumed_from"]], detail["checkpoints"]["gpu6"]
    assert_no_containers()


def test_a_controller_killed_while_a_job_recovers(bed):
    """kill -9 of the controller while a job is `recovering` (held, by the fault hook, once its spare is swapped in
    and recorded): the new controller carries the recovery on from the job's record, and the job ends done with
    both attempts in it."""
    client = bed.restart("--optirack-fault-hold-recovering", "swapped")
    job = _kill_gpu2_of_a_running_job(client, 40)

    def held() -> bool:
        j = client.get(f"/jobs/{job['id']}")["job"]
        return j["state"] == "recovering" and "gpu2" not in j["gpus"] and len(j["gpus"]) == 2

    wait_for(held, 60, "the spare swapped in and the recovery held")
    bed.controller.kill()
    client = bed.restart()
    done = _ended(client, job["id"])
    assert done["state"] == "done" and done["iterations_done"] == 40, (done["state"], done["reason"])
    (rec,) = done["recoveries"]
    assert rec["attempt"] == done["attempt"] == 1 and set(rec["lost"]) == {"gpu2"}, rec
    assert rec["spares"]["gpu2"] in done["gpus"] and rec["resumed_from"] >= 3, rec
    ranks = client.get(f"/jobs/{job['id']}")["job"]["ranks"]
    assert {r["attempt"] for r in ranks["gpu1"]} == {0, 1}  # the survivor's reports: before and after the restart
    assert_no_containers()


def test_a_nic_that_cannot_be_handed_over(fragmented):
    client = fragmented
    home, away = netns_of(RACK.server_of["gpu4"]), "gpu4-away"
    sh("ip", "-n", home, "link", "set", "dev", "gpu4", "down")
    sh("ip", "-n", home, "link", "set", "dev", "gpu4", "name", away)  # the hand-over finds no gpu4
    try:
        before = client.get("/ocs/circuits")["circuits"]
        job = client.post("/jobs", {"gpus": RED, "policy": "regroup", "workload": {"iterations": 3}})["job"]
        done = _ended(client, job["id"])
        assert "gpu4" in done["reason"], done["reason"]
        assert_clean(client, done, "", circuits=before)  # placed, then undone
        assert len(done["events"]) == 2
    finally:
        if ns.has_link(away, home):
            if ns.has_link("gpu4", home):  # the clean-up rebuilt gpu4 on its port (its NIC looked lost)
                sh("ip", "-n", home, "link", "delete", "dev", away)
            else:
                sh("ip", "-n", home, "link", "set", "dev", away, "name", "gpu4")
        nics.make(next(n for n in nic_plans(RACK) if n.gpu == "gpu4"), RACK)


def test_an_ocs_bridge_that_refuses_flows(fragmented):
    """OVS refuses flow-mods once table 0 of the OCS bridge is full (a real OFPFMFC_TABLE_FULL):
    the placement fails, is rolled back, and once the table has room the OCS app puts the
    circuits back by itself."""
    client = fragmented
    before = client.get("/ocs/circuits")["circuits"]
    sh(
        "ovs-vsctl",
        "--",
        "--id=@ft",
        "create",
        "Flow_Table",
        "flow_limit=9",
        "overflow_policy=refuse",
        "--",
        "set",
        "Bridge",
        "ocs1",
        "flow_tables:0=@ft",
    )
    try:
        job = client.post("/jobs", {"gpus": RED, "policy": "regroup", "workload": {"iterations": 3}})["job"]
        done = _ended(client, job["id"])
        events = client.get("/events", limit=5)["events"]
        failed = [e for e in events if e["id"] in done["events"] or e["job"] == job["id"]]
        assert failed and failed[-1]["status"] == "failed" and "refused" in failed[-1]["error"], failed
    finally:
        sh("ovs-vsctl", "clear", "Bridge", "ocs1", "flow_tables")
    assert_clean(client, done, "refused", circuits=before)

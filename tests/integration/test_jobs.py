"""Jobs on the emulated paper rack through REST: the fragmented start, regrouping a running job,
rollback of a failed start, and a controller killed with jobs running, configuring and queued. Every test starts
from the rack file's circuits, the paper's fragmented start (the `bed` fixture)."""
from __future__ import annotations

import subprocess
import time

import pytest

from controller.client import ApiError
from controller.core.aggregators import tables as compute_tables  # the NICs' entries and the aggregators'
from controller.core.circuits import CircuitMap
from controller.core.rack import load_rack
from controller.drivers.containers import container_name
from emulation import ovs
from tests.integration.helpers import BIN, PAPER, ROOT, wait_for
from tests.integration.testbed import device_circuits, switch_tables, uplink_bytes, uplink_counters

RACK = load_rack(PAPER)
RED, BLUE = ["gpu1", "gpu2", "gpu3", "gpu4"], ["gpu5", "gpu6"]
MISSING_IMAGE = "127.0.0.1:9/optirack-missing:latest"  # its pull is refused on loopback: no traffic leaves the host


def device_switch_of(gpu: str) -> str:
    """Which aggregator switch the OCS bridge itself connects a GPU's NIC to."""
    port = RACK.gpu_port(gpu).port
    partner = next(b for a, b in ovs.circuit_flows("ocs1") if a == port)
    return RACK.endpoints[type(RACK.gpu_port(gpu))("ocs1", partner)].name


def wait_job(client, job_id: str, timeout: float = 300) -> dict:
    wait_for(lambda: client.get(f"/jobs/{job_id}")["job"]["state"] not in ("pending", "configuring", "running"),
             timeout, f"{job_id} to end")
    return client.get(f"/jobs/{job_id}")["job"]


def _iterations(client, job_id: str) -> int:
    """Iterations done so far by a job that must not have ended."""
    job = client.get(f"/jobs/{job_id}")["job"]
    assert job["state"] in ("pending", "configuring", "running"), (job["state"], job["reason"])
    return job["iterations_done"]


def _uplink_window(client, job_id: str, iterations: int) -> tuple[dict, dict]:
    """Uplink counters before and after `job_id` did `iterations` more iterations (no circuit change inside)."""
    first = _iterations(client, job_id)
    before = uplink_counters(RACK)
    wait_for(lambda: _iterations(client, job_id) >= first + iterations, 120, f"{iterations} iterations of {job_id}")
    return before, uplink_counters(RACK)


def test_regrouping_a_fragmented_running_job(bed):
    """The mechanism, not the speed-up: after the regroup the job's NICs all sit under one switch on
    the OCS bridge, and its own traffic stops crossing the inter-switch uplink, while the other job's
    still does. (The speed-up itself is the demo's to measure, at a steep uplink.)"""
    client = bed.client
    long = {"iterations": 100000, "compute_seconds": 0.05}
    red = client.post("/jobs", {"gpus": RED, "policy": "fixed", "workload": long})["job"]["id"]
    blue = client.post("/jobs", {"gpus": BLUE, "policy": "fixed", "workload": {**long, "compute_seconds": 0}})["job"][
        "id"
    ]
    wait_for(lambda: _iterations(client, red) >= 2 and _iterations(client, blue) >= 2, 180, "both jobs to iterate")
    assert {device_switch_of(g) for g in RED} == {"as1", "as2"}  # the paper's fragmented start
    red_ips = {RACK.addresses[g][0] for g in RED}
    blue_ips = {RACK.addresses[g][0] for g in BLUE}
    before = uplink_bytes(*_uplink_window(client, red, 3), red_ips)

    body = client.post(f"/jobs/{red}/regroup")
    ev, switch = body["event"], body["job"]["switches"]
    assert ev["kind"] == "regroup" and ev["status"] == "ok" and ev["dark_window_s"] >= 0.025
    assert len(switch) == 1 and {device_switch_of(g) for g in RED} == set(switch)  # on the OCS bridge itself
    assert all(device_switch_of(g) == s for g, s in zip(BLUE, ("as1", "as2"), strict=True))  # blue untouched
    assert switch_tables(RACK) == compute_tables(RACK, CircuitMap.parse(RACK, client.get("/ocs/circuits")["circuits"]))

    # Packets of red's that were in flight when it moved (in the lossless fabric's uplink queue, up to its depth)
    # reach a switch that now sends red's addresses back over the uplink: let them drain for three iterations, then
    # measure three more.
    _uplink_window(client, red, 3)
    window = _uplink_window(client, red, 3)
    after, blue_after = uplink_bytes(*window, red_ips), uplink_bytes(*window, blue_ips)
    print(
        f"bytes to red's NICs across the uplink over 3 iterations: {before} before the regroup, {after} after; "
        f"blue's meanwhile: {blue_after}"
    )
    assert before > 100_000, "red's ring did not cross the uplink while fragmented"
    assert after <= 0.01 * before, "red's traffic still crosses the uplink after the regroup"
    assert blue_after > 100_000, "blue, still spread over both switches, should still cross the uplink"


def test_regroup_all_and_bad_requests(bed):
    client = bed.client
    a = client.post("/jobs", {"gpus": ["gpu1", "gpu3"], "policy": "fixed", "workload": {"iterations": 1000}})["job"]
    with pytest.raises(ApiError) as info:
        client.post("/jobs", {"gpus": ["gpu3", "gpu4"], "policy": "fixed", "queue": False})
    assert info.value.status == 409 and "gpu3 is held by" in info.value.message and info.value.field == "gpus"
    for body, status in [
        ({"gpus": 9}, 409),
        ({"gpus": ["gpu42"]}, 400),
        ({"gpus": 2, "policy": "magic"}, 400),
        ({"gpus": 2, "workload": {"model": "alexnet"}}, 400),
        ({}, 400),
        ({"gpus": "two"}, 400),
        ({"gpus": 2, "gpu_model": "K80"}, 400),
        ({"gpus": 3, "gpu_model": "TitanV"}, 409),
    ]:
        with pytest.raises(ApiError) as info:
            client.post("/jobs", body)
        assert info.value.status == status, (body, info.value)
    wait_for(lambda: client.get(f"/jobs/{a['id']}")["job"]["state"] == "running", 60, "job a to run")
    result = client.post("/regroup")
    assert [m["job"] for m in result["jobs_moved"]] == [a["id"]] and len(result["jobs_moved"][0]["switches_after"]) == 1
    assert client.post(f"/jobs/{a['id']}/regroup")["note"] == "already under one switch"
    with pytest.raises(ApiError) as info:
        client.get("/jobs/job-999")
    assert info.value.status == 404
    assert client.post(f"/jobs/{a['id']}/stop")["job"]["state"] == "stopped"
    assert client.delete(f"/jobs/{a['id']}")["job"]["state"] == "stopped"
    with pytest.raises(ApiError) as info:  # deleted: forgotten
        client.get(f"/jobs/{a['id']}")
    assert info.value.status == 404


def _device_matches(client, circuits: list) -> None:
    """What the devices hold: the OCS bridge's flows are `circuits`, the switches' tables follow from them."""
    assert device_circuits(RACK) == sorted(circuits)
    assert switch_tables(RACK) == compute_tables(RACK, CircuitMap.parse(RACK, circuits))


def _containers_of(bed, job_id: str, role: str | None = "worker") -> dict[str, str]:
    """GPU -> the server whose engine holds `job_id`'s container of that role (None: any role) for it."""
    return {w["gpu"]: server for server in RACK.servers for w in bed.driver.workers(server, job_id)
            if role is None or w["role"] == role}


def test_a_killed_controller_finds_each_job_where_it_should_be(bed):
    """Reconciling after a crash: SIGKILL with a job running, two configuring (held there by the fault hook, their
    circuits and containers in place) and one queued; one configuring job loses a worker while the controller is
    down. The new controller adopts the running job, carries the intact configuring one on, undoes the other (its
    circuits back, nothing left on any engine), and the queued one keeps its place and runs.

    The running job (two M40, one under each switch) keeps a warm spare on the free M40 under each switch (gpu2,
    gpu4), and the jobs placed just after the first restart take those very GPUs: the restart's sweep and their
    starts both remove the old controller's warm spares there, and neither may fail for the other."""
    client = bed.client
    work = lambda n: {"model": "resnet50", "iterations": n, "compute_seconds": 0.15}  # noqa: E731
    # 60 iterations: it did about 20 by the second restart here, which must find it still running
    running = client.post("/jobs", {"gpus": ["gpu1", "gpu3"], "policy": "fixed", "workload": work(60)})["job"]["id"]
    wait_for(lambda: _iterations(client, running) >= 2, 120, "the first job to run")
    wait_for(lambda: set(_containers_of(bed, running)) == {"gpu1", "gpu2", "gpu3", "gpu4"}, 120,
             "the running job's warm spares on gpu2 and gpu4")
    client = bed.restart("--optirack-fault-hold-configuring")  # new jobs stop at configuring, as if it died there
    kept = client.post("/jobs", {"gpus": ["gpu2", "gpu6"], "policy": "regroup", "workload": work(20)})["job"]["id"]
    undone = client.post("/jobs", {"gpus": ["gpu4", "gpu5"], "policy": "regroup", "workload": work(20)})["job"]["id"]
    wait_for(lambda: len(_containers_of(bed, kept)) == len(_containers_of(bed, undone)) == 2, 120,
             "both held jobs' containers")
    assert set(_containers_of(bed, running)) == {"gpu1", "gpu3"}, "the warm spares are still there"
    queued = client.post("/jobs", {"gpus": 2, "workload": work(3)})["job"]
    assert queued["state"] == "queued" and queued["position"] == 1, queued
    assert {client.get(f"/jobs/{j}")["job"]["state"] for j in (kept, undone)} == {"configuring"}

    bed.controller.kill()
    server = _containers_of(bed, undone)["gpu4"]  # its worker is lost while no controller is there to see it
    bed.driver.client(server).containers.get(container_name(undone, "gpu4")).remove(force=True)
    client = bed.restart()

    assert _iterations(client, running) >= 2  # adopted, not failed
    wait_for(lambda: client.get(f"/jobs/{undone}")["job"]["state"] == "failed", 60, "the broken job undone")
    broken = client.get(f"/jobs/{undone}")["job"]
    assert "the containers of gpu4 are gone" in broken["reason"], broken["reason"]
    undo = next(e for e in client.get("/events")["events"] if e["id"] == broken["events"][-1])
    assert undo["reason"] == f"{undone}: undo placement" and undo["status"] == "ok", undo
    assert _containers_of(bed, undone, role=None) == {}  # nothing of it on any engine, sandboxes included
    for job_id, iterations in ((kept, 20), (running, 60), (queued["id"], 3)):
        done = wait_job(client, job_id)
        assert done["state"] == "done" and done["iterations_done"] == iterations, (job_id, done["reason"])
    _device_matches(client, client.get("/ocs/circuits")["circuits"])


def test_a_container_that_cannot_start_rolls_back(bed):
    with bed.options("--optirack-worker-image", MISSING_IMAGE) as client:
        before = client.get("/ocs/circuits")["circuits"]
        job = client.post("/jobs", {"gpus": RED, "policy": "regroup", "workload": {"iterations": 3}})["job"]
        done = wait_job(client, job["id"], 120)
        assert done["state"] == "failed" and "cannot start the container" in done["reason"]
        assert len(done["events"]) == 2  # placed, then undone
        assert client.get("/ocs/circuits")["circuits"] == before
        _device_matches(client, before)  # the OCS bridge and the switches hold what they held before
        assert all(g["job"] is None for g in client.get("/topology")["gpus"].values())
        assert bed.containers() == []


def test_cli_submit_and_wait(bed):
    ctl = bed.controller
    args = [str(BIN / "optirack"), "--url", ctl.url, "--token-file", str(ctl.state_dir / "token")]
    t0 = time.monotonic()
    out = subprocess.run(
        [*args, "submit", "--gpus", "2", "--iterations", "3", "--wait"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert " done " in out.stdout and "iter       3/3" in out.stdout
    listing = subprocess.run([*args, "jobs"], capture_output=True, text=True, cwd=ROOT).stdout
    assert "done" in listing
    print(f"a 2-GPU job of 3 iterations through the CLI: {time.monotonic() - t0:.1f} s")

"""Jobs on the emulated paper rack through REST: the fragmented start, regrouping a running job,
rollback of a failed start, and a controller restart in the middle of a job."""
from __future__ import annotations

import statistics
import subprocess
import time

import pytest

from controller.client import ApiError
from controller.core.rack import load_rack
from emulation import ovs
from emulation.harness import ControllerProcess, Testbed
from tests.integration.helpers import BIN, PAPER, ROOT, our_containers, wait_for

RACK = load_rack(PAPER)
FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]  # the rack file's server-centric cabling
RED, BLUE = ["gpu1", "gpu2", "gpu3", "gpu4"], ["gpu5", "gpu6"]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with Testbed(RACK, PAPER, tmp_path_factory.mktemp("jobs")) as tb:
        yield tb


@pytest.fixture
def fragmented(bed):
    wait_for(lambda: not bed.client.get("/jobs", state="pending,configuring,running")["jobs"], 60, "earlier jobs to end")
    bed.client.put("/ocs/circuits", {"circuits": FRAGMENTED})
    return bed


def restart(tb: Testbed, *extra: str) -> None:
    """Stop the controller and start it again on the same ports and state."""
    old = tb.controller
    old.stop()
    tb.controller = ControllerProcess(old.state_dir.parent, tb.rack_file, list(extra), old.of_port, old.rest_port)
    tb.controller.start()
    tb.client = tb.controller.client()
    wait_for(tb._ready, 30, "the restarted controller to resynchronise")


def device_switch_of(gpu: str) -> str:
    """Which aggregator switch the OCS bridge itself connects a GPU's NIC to."""
    port = RACK.gpu_port(gpu).port
    partner = next(b for a, b in ovs.circuit_flows("ocs1") if a == port)
    return RACK.endpoints[type(RACK.gpu_port(gpu))("ocs1", partner)].name


def wait_job(client, job_id: str, timeout: float = 300) -> dict:
    wait_for(lambda: client.get(f"/jobs/{job_id}")["job"]["state"] not in ("pending", "configuring", "running"),
             timeout, f"{job_id} to end")
    return client.get(f"/jobs/{job_id}")["job"]


def test_regrouping_a_fragmented_running_job(fragmented):
    client = fragmented.client
    red = client.post("/jobs", {"gpus": RED, "policy": "fixed", "workload": {"iterations": 30, "compute_seconds": 0.05}})["job"]
    blue = client.post("/jobs", {"gpus": BLUE, "policy": "fixed",
                                 "workload": {"iterations": 400, "compute_seconds": 0}})["job"]
    wait_for(lambda: client.get(f"/jobs/{red['id']}")["job"]["iterations_done"] >= 10, 120, "10 iterations of red")
    assert {device_switch_of(g) for g in RED} == {"as1", "as2"}  # the paper's fragmented start
    body = client.post(f"/jobs/{red['id']}/regroup")
    ev = body["event"]
    assert ev["kind"] == "regroup" and ev["dark_window_s"] >= 0.025
    switch = body["job"]["switches"]
    assert len(switch) == 1 and {device_switch_of(g) for g in RED} == set(switch)  # on the OCS bridge itself
    assert all(device_switch_of(g) == s for g, s in zip(BLUE, ("as1", "as2"), strict=True))  # blue untouched
    done = wait_job(client, red["id"])
    assert done["state"] == "done" and done["iterations_done"] == 30
    log = done["iteration_log"]
    before = [i["iter_s"] for i in log[1:] if i["t_end"] < ev["dark_start"]]
    after = [i["iter_s"] for i in log if i["t_start"] > ev["dark_end"]][1:]
    print(f"red iteration before regroup {statistics.median(before):.3f} s, after {statistics.median(after):.3f} s")
    assert statistics.median(after) < 0.9 * statistics.median(before)
    client.delete(f"/jobs/{blue['id']}")
    assert wait_job(client, blue["id"])["state"] == "stopped"
    assert our_containers() == {}


def test_regroup_all_and_bad_requests(fragmented):
    client = fragmented.client
    a = client.post("/jobs", {"gpus": ["gpu1", "gpu3"], "policy": "fixed", "workload": {"iterations": 1000}})["job"]
    with pytest.raises(ApiError) as info:
        client.post("/jobs", {"gpus": ["gpu3", "gpu4"], "policy": "fixed", "queue": False})
    assert info.value.status == 409 and "gpu3 is held by" in info.value.message and info.value.field == "gpus"
    for body, status in [({"gpus": 9}, 409), ({"gpus": ["gpu42"]}, 400), ({"gpus": 2, "policy": "magic"}, 400),
                         ({"gpus": 2, "workload": {"model": "alexnet"}}, 400), ({}, 400), ({"gpus": "two"}, 400),
                         ({"gpus": 2, "gpu_model": "K80"}, 400), ({"gpus": 3, "gpu_model": "TitanV"}, 409)]:
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
    client.delete(f"/jobs/{a['id']}")
    assert wait_job(client, a["id"])["state"] == "stopped"


def test_controller_restart_keeps_the_job_and_the_circuits(fragmented):
    client = fragmented.client
    job = client.post("/jobs", {"gpus": 4, "policy": "regroup", "workload": {"iterations": 25, "compute_seconds": 0.1}})["job"]
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["iterations_done"] >= 3, 120, "the job to run")
    circuits = client.get("/ocs/circuits")["circuits"]
    restart(fragmented)
    client = fragmented.client
    assert client.get("/ocs/circuits")["circuits"] == circuits
    assert client.get(f"/jobs/{job['id']}")["job"]["state"] == "running"
    done = wait_job(client, job["id"])
    assert done["state"] == "done" and done["iterations_done"] == 25, done["reason"]
    assert sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in ovs.circuits_of(ovs.circuit_flows("ocs1"))) == sorted(circuits)


def test_a_container_that_cannot_start_rolls_back(fragmented):
    restart(fragmented, "--optirack-worker-image", "optirack-missing:latest")
    client = fragmented.client
    try:
        before = client.get("/ocs/circuits")["circuits"]
        job = client.post("/jobs", {"gpus": RED, "policy": "regroup", "workload": {"iterations": 3}})["job"]
        done = wait_job(client, job["id"], 120)
        assert done["state"] == "failed" and "cannot start the container" in done["reason"]
        assert len(done["events"]) == 2  # placed, then undone
        assert client.get("/ocs/circuits")["circuits"] == before
        assert sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in ovs.circuits_of(ovs.circuit_flows("ocs1"))) == before
        assert all(g["job"] is None for g in client.get("/topology")["gpus"].values())
        assert our_containers() == {}
    finally:
        restart(fragmented)


def test_cli_submit_and_wait(fragmented):
    ctl = fragmented.controller
    args = [str(BIN / "optirack"), "--url", ctl.url, "--token-file", str(ctl.state_dir / "token")]
    t0 = time.monotonic()
    out = subprocess.run([*args, "submit", "--gpus", "2", "--iterations", "3", "--wait"], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert " done " in out.stdout and "iter       3/3" in out.stdout
    listing = subprocess.run([*args, "jobs"], capture_output=True, text=True, cwd=ROOT).stdout
    assert "done" in listing
    print(f"a 2-GPU job of 3 iterations through the CLI: {time.monotonic() - t0:.1f} s")

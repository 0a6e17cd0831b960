"""Placement on the emulated rack: three fragmented jobs regrouped in one reconfiguration (a dry run
first, which changes nothing), a job that cannot gain left alone, the moved jobs iterating on, and a
queued job that starts when a running one ends. Checked on the devices themselves (the OCS bridge's
flows), never by timing.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from controller.client import ApiError
from controller.core.rack import PortRef, load_rack
from emulation import ovs
from emulation.harness import Testbed
from tests.integration.helpers import BIN, ROOT, assert_no_containers, wait_for

RACK_FILE = ROOT / "topologies" / "rack8-3as.yaml"
RACK = load_rack(RACK_FILE)  # 8 GPUs; as1: gpu1-3, as2: gpu4-6, as3: gpu7-8; four downlinks a switch
JOBS = {"a": ["gpu1", "gpu4", "gpu7"], "b": ["gpu2", "gpu5"], "c": ["gpu3", "gpu8"], "d": ["gpu6"]}
LONG = {"model": "resnet50", "iterations": 100000, "compute_seconds": 0.2}  # runs until stopped
ACTIVE = ("queued", "pending", "configuring", "running")


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with Testbed(RACK, RACK_FILE, tmp_path_factory.mktemp("placement")) as tb:
        yield tb


def device_switch_of(gpu: str) -> str:
    """The aggregator switch the OCS bridge itself joins a GPU's NIC to."""
    port = RACK.gpu_port(gpu)
    partner = next(b for a, b in ovs.circuit_flows(port.device) if a == port.port)
    return RACK.endpoints[PortRef(port.device, partner)].name


def device_circuits() -> list[list[str]]:
    return sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in ovs.circuits_of(ovs.circuit_flows("ocs1")))


def snapshot(client) -> dict:
    """What a dry run must not change: circuits (controller and device), events, and the jobs' placement."""
    keys = ("id", "state", "gpus", "switches", "circuits", "events", "note")
    return {"circuits": client.get("/ocs/circuits")["circuits"], "device": device_circuits(),
            "flows": sorted(ovs.circuit_flows("ocs1")), "events": [e["id"] for e in client.get("/events")["events"]],
            "jobs": [{k: j[k] for k in keys} for j in client.get("/jobs")["jobs"]]}


def cli(bed, *args: str) -> str:
    ctl = bed.controller
    out = subprocess.run([str(BIN / "optirack"), "--url", ctl.url, "--token-file", str(ctl.state_dir / "token"), *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def stop_everything(client) -> None:
    for j in client.get("/jobs")["jobs"]:
        if j["state"] in ACTIVE:
            try:
                client.post(f"/jobs/{j['id']}/stop")
            except ApiError:  # between states: it ends by itself, or the rack goes down with the module
                pass
    wait_for(lambda: not any(j["state"] in ACTIVE for j in client.get("/jobs")["jobs"]), 120, "every job to end")


def test_defragment_in_one_change_and_a_queued_job_starts_when_gpus_free_up(bed):
    client = bed.client
    try:
        ids = {}
        for name, gpus in JOBS.items():  # the fragmented start: fixed placement keeps the cabling
            ids[name] = client.post("/jobs", {"name": name, "gpus": gpus, "policy": "fixed", "workload": LONG})["job"][
                "id"
            ]
        waiting = client.post(
            "/jobs", {"name": "e", "gpus": 2, "workload": {"iterations": 5, "compute_seconds": 0.05}}
        )["job"]
        assert (waiting["state"], waiting["position"]) == ("queued", 1)  # all eight GPUs are held
        with pytest.raises(ApiError) as info:
            client.post("/jobs", {"gpus": 1, "queue": False})
        assert info.value.status == 409 and "not queued" in info.value.message
        wait_for(
            lambda: all(client.get(f"/jobs/{i}")["job"]["iterations_done"] >= 1 for i in ids.values()),
            240,
            "the four jobs to run",
        )
        assert [len({device_switch_of(g) for g in gpus}) for gpus in JOBS.values()] == [3, 2, 2, 1]

        before = snapshot(client)
        text = cli(bed, "regroup", "--dry-run")
        plan = json.loads(cli(bed, "--json", "regroup", "--dry-run"))
        assert snapshot(client) == before  # the dry runs changed nothing, on the controller or the device
        assert "3 job(s) moved" in text and f"optirack regroup --version {plan['version']}" in text
        moved = {m["job"] for m in plan["jobs_moved"]}
        assert moved == {ids["a"], ids["b"], ids["c"]}
        assert (
            plan["jobs_untouched"][0]["job"] == ids["d"]
            and plan["jobs_untouched"][0]["reason"] == "already under one switch"
        )
        assert (plan["switches_before"], plan["switches_after"]) == (8, 4)

        done = json.loads(cli(bed, "--json", "regroup", "--version", str(plan["version"])))
        ev = done["event"]
        assert done["applied"] and ev["status"] == "ok" and ev["kind"] == "regroup"
        assert sorted(ev["removed"]) == plan["circuits"]["remove"] and sorted(ev["added"]) == plan["circuits"]["add"]
        expected = sorted(
            set(map(tuple, before["device"])) - set(map(tuple, plan["circuits"]["remove"]))
            | set(map(tuple, plan["circuits"]["add"]))
        )
        assert device_circuits() == [list(c) for c in expected]  # exactly the plan's circuits, on the OCS bridge
        assert (
            ev["dark_start"] < ev["dark_end"] and ev["dark_window_s"] >= ev["switching_time_s"] > 0
        )  # one dark window
        for name, gpus in JOBS.items():
            job = client.get(f"/jobs/{ids[name]}")["job"]
            if job["id"] in moved:  # under one switch, on the device; stalled once: one reconfiguration
                assert len({device_switch_of(g) for g in gpus}) == 1 and len(job["switches"]) == 1
                assert job["events"] == [ev["id"]]
            else:  # could not gain: not touched
                assert (
                    job["events"] == []
                    and job["circuits"] == next(j for j in before["jobs"] if j["id"] == job["id"])["circuits"]
                )
        with pytest.raises(ApiError) as info:  # that plan is spent: the map has moved on
            client.post("/regroup", {"version": plan["version"]})
        assert info.value.status == 409 and "version" in info.value.message

        at_regroup = {i: client.get(f"/jobs/{i}")["job"]["iterations_done"] for i in moved}
        wait_for(
            lambda: all(client.get(f"/jobs/{i}")["job"]["iterations_done"] >= n + 3 for i, n in at_regroup.items()),
            120,
            "the moved jobs to iterate on under one switch",
        )
        assert client.get(f"/jobs/{waiting['id']}")["job"]["state"] == "queued"  # still no GPU free

        b = client.post(f"/jobs/{ids['b']}/stop")["job"]  # two GPUs free: the queued job's turn
        wait_for(
            lambda: client.get(f"/jobs/{waiting['id']}")["job"]["state"] not in ACTIVE, 120, "the queued job to run"
        )
        e = client.get(f"/jobs/{waiting['id']}")["job"]
        assert e["state"] == "done" and e["iterations_done"] == 5, e["reason"]
        assert sorted(e["gpus"]) == sorted(JOBS["b"]) and e["started_at"] >= b["ended_at"]
        for name in ("a", "c", "d"):  # ran on beside it
            job = client.get(f"/jobs/{ids[name]}")["job"]
            assert job["state"] == "running", (name, job["state"], job["reason"])
    finally:
        stop_everything(client)
    assert_no_containers()

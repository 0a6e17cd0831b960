"""Concurrency on the emulated rack: PUT /ocs/circuits raced against job placements and regroups.

Each round starts from the paper's fragmented cabling, then sends a PUT that swaps the circuits
of gpu5 and gpu6 (which no job uses) and, `delay` ms before or after it, a placement of a job on
gpu1 and gpu3, or a regroup of such a job already running. After each round:
- the PUT, if answered 200, is still in force: no change admitted after it undid it;
- no placement or regroup event touches a circuit of a GPU outside its job;
- the controller's circuit map equals the OCS bridge's flows, and the switches' tables equal
  the forwarding computed from that map.
The lost update this guards against showed in 6 rounds of 6 at delays of 2 to 15 ms before it was fixed; 20 races
(two of each kind at five delays) keep a reproduction that frequent all but certain to be caught.
"""
from __future__ import annotations

import threading
import time

import pytest

from controller.client import ApiError
from controller.core.aggregators import tables as compute_tables  # the NICs' entries and the aggregators'
from controller.core.circuits import CircuitMap
from controller.core.rack import load_rack
from emulation import ovs
from tests.integration.helpers import PAPER, assert_no_containers, ofctl, wait_for

RACK = load_rack(PAPER)
FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]
SWAPPED = [c for c in FRAGMENTED if c[0] not in ("ocs1:5", "ocs1:6")] + [["ocs1:5", "ocs1:22"], ["ocs1:6", "ocs1:12"]]
JOB_GPUS = ["gpu1", "gpu3"]
DELAYS_MS = [-10, 0, 2, 5, 15]  # negative: the job's request goes first
GPU_OF_PORT = {str(RACK.gpu_port(g)): g for g in RACK.gpus}
ACTIVE = "pending,configuring,running"




def _stop_all(client) -> None:
    for job in client.get("/jobs", state=ACTIVE)["jobs"]:
        wait_for(
            lambda j=job: client.get(f"/jobs/{j['id']}")["job"]["state"] != "configuring", 60, "configuring to end"
        )
        try:
            client.delete(f"/jobs/{job['id']}")
        except ApiError:
            pass
    wait_for(lambda: not client.get("/jobs", state=ACTIVE)["jobs"], 120, "every job to end")


def _events(client, ids) -> list[dict]:
    page = client.get("/events", limit=200)["events"]
    return [e for e in page if e["id"] in set(ids)]


def _device_map() -> list[list[str]]:
    return sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in ovs.circuits_of(ovs.circuit_flows("ocs1")))


def _switch_table(name: str) -> dict[str, int]:
    table = {}
    for line in ofctl("dump-flows", name).splitlines():
        if "nw_dst=" in line:
            table[line.split("nw_dst=")[1].split()[0].rstrip(",")] = int(line.split("output:")[1].split()[0])
    return table


def _check_round(client, put: dict, job_id: str, label: str) -> None:
    circuits = client.get("/ocs/circuits")["circuits"]
    # the controller's map is what the devices hold
    assert _device_map() == circuits, f"{label}: the OCS bridge's flows differ from the controller's map"
    tables = compute_tables(RACK, CircuitMap.parse(RACK, circuits))
    for switch in ("as1", "as2"):
        assert _switch_table(switch) == tables[switch], f"{label}: {switch}'s table does not follow the circuits"
    job = client.get(f"/jobs/{job_id}")["job"]
    for ev in _events(client, job["events"]):
        for circuit in ev["removed"] + ev["added"]:
            gpus = {GPU_OF_PORT[p] for p in circuit if p in GPU_OF_PORT}
            assert gpus <= set(job["gpus"]), f"{label}: event {ev['id']} ({ev['reason']}) touched {circuit}"
    if put.get("status") == 200:  # answered 200: in force, unless a change admitted after it changed it
        later = [e for e in client.get("/events", limit=200)["events"] if e["id"] > put["event"]["id"]]
        for circuit in SWAPPED:
            if circuit in circuits:
                continue
            own = {GPU_OF_PORT.get(p) for p in circuit} & set(job["gpus"])
            undone_later = any(circuit in e["removed"] for e in later)
            assert own and undone_later, f"{label}: the PUT's circuit {circuit} was undone"


def _race(client, first, second, delay_s: float) -> None:
    go = threading.Barrier(2)
    errors = []

    def run(action, wait):
        go.wait()
        time.sleep(wait)
        try:
            action()
        except Exception as e:  # noqa: BLE001 (reported by the test below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(first, 0.0)), threading.Thread(target=run, args=(second, delay_s))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def _put_swap(client, put: dict):
    def action():
        try:
            put["body"] = client.put("/ocs/circuits", {"circuits": SWAPPED})
            put.update(status=200, event=put["body"]["event"])
        except ApiError as e:  # 409 (a running job's circuit, or busy) is a fair answer; it must change nothing
            put.update(status=e.status)

    return action


ROUNDS = 2  # of each kind at each delay: 20 races in all
WORKLOAD = {"iterations": 100000, "compute_seconds": 0.2}  # runs until stopped


def _round(client, kind: str, delay_ms: int, label: str) -> int | None:
    """One race; returns the PUT's status."""
    _stop_all(client)
    client.put("/ocs/circuits", {"circuits": FRAGMENTED})
    put, job = {}, {}
    if kind == "place":

        def action():
            job.update(client.post("/jobs", {"gpus": JOB_GPUS, "policy": "regroup", "workload": WORKLOAD})["job"])
    else:
        job.update(client.post("/jobs", {"gpus": JOB_GPUS, "policy": "fixed", "workload": WORKLOAD})["job"])
        wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["state"] == "running", 120, "the job to run")

        def action():
            client.post(f"/jobs/{job['id']}/regroup")

    swap = _put_swap(client, put)
    _race(client, *((swap, action) if delay_ms >= 0 else (action, swap)), abs(delay_ms) / 1000)
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["state"] != "configuring", 120, "the placement")
    state = client.get(f"/jobs/{job['id']}")["job"]
    assert state["state"] == "running", f"{label}: {state['state']} {state['reason']}"
    assert len(state["switches"]) == 1, f"{label}: the job is not under one switch"
    _check_round(client, put, job["id"], label)
    return put.get("status")


@pytest.mark.parametrize("delay_ms", DELAYS_MS)
def test_put_raced_against_placements_and_regroups(bed, delay_ms):
    answered: dict = {}
    for rnd in range(ROUNDS):
        for kind in ("place", "regroup"):
            status = _round(bed.client, kind, delay_ms, f"{kind}, delay {delay_ms} ms, round {rnd}")
            answered[status] = answered.get(status, 0) + 1
    _stop_all(bed.client)
    assert_no_containers()
    print(f"delay {delay_ms} ms: PUT answers {answered}")
    assert sum(answered.values()) == 2 * ROUNDS
    if delay_ms > 0:  # the PUT went first: it must have got through, or the race did not test the lost update
        assert answered.get(200, 0) >= 1, answered

"""Faults as a rack shows them, on the emulated paper rack (four servers, four engines): a server whose workers die
before its engine (a cascade), a controller killed in the middle of a recovery from a server's death, a server that
hangs (every process stopped, links up) and wakes, and a straggler that is only slow, then stopped outright, then its
whole server hung. Every job ends done, its ranks on servers that are up, under one switch; what a woken server ran is
removed by the controller before its GPUs are free, and nothing it prints after waking reaches the job's record.
(The fault matrix at every step of a recovery is a unit test on virtual time: tests/unit/test_fault_matrix.py.)"""
from __future__ import annotations

import json
import os
import signal
import time

from controller.core.emulated import RUN_DIR
from controller.core.rack import load_rack
from emulation import engines, servers
from tests.integration.helpers import PAPER, rack_cli, seen_up, wait_for, wait_job

RACK = load_rack(PAPER)

PLANS = {p.server: p for p in engines.engine_plans(RACK)}
JOB = {"gpus": ["gpu1", "gpu2"], "policy": "regroup", "checkpoint_every": 3,
       "workload": {"iterations": 24, "compute_seconds": 0.05}}


def _running(client, iterations: int = 6, body: dict | None = None) -> dict:
    job = client.post("/jobs", body or JOB)["job"]
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["iterations_done"] >= iterations, 120, "iterations")
    return job


def _done_on_live_servers(client, job_id: str, down: set[str]) -> dict:
    done = wait_job(client, job_id, 300)
    assert done["state"] == "done" and done["iterations_done"] == 24, (done["state"], done["reason"])
    assert not {RACK.server_of[g] for g in done["gpus"]} & down and len(done["switches"]) == 1, done
    return done


def test_a_server_whose_workers_die_before_its_engine_is_recovered(fresh):
    """The cascade: srv2's workers killed, its daemons 0.1 s later. The first sign is a killed worker on a server that
    still answers; the engine's death joins the recovery, and the job goes on under one switch. The job aggregates:
    at the fail-over the old attempt's pool is freed at its aggregator (its log says so), and the new attempt sums at
    an aggregator, exactly, the one of the switch its record names being told of the job's end."""
    client = fresh.client
    job = _running(client, body={**JOB, "collective": "aggregate"})
    old, key = job["aggregation"]["switch"], job["aggregation"]["key"]
    assert servers.kill_containers(RACK, PLANS["srv2"]) >= 1
    time.sleep(0.1)
    rack_cli("server", "kill", "srv2")
    done = _done_on_live_servers(client, job["id"], {"srv2"})
    lost = {g for r in done["recoveries"] for g in r["lost"]}
    assert "gpu2" in lost and "gpu2" not in done["gpus"], done["recoveries"]
    agg = done["aggregation"]
    assert agg["collective"] == "aggregate" and agg["switch"] == done["switches"][0] and agg["key"] == key, agg
    logs = client.get(f"/jobs/{job['id']}/logs")["logs"]  # each worker's last lines (its start line long gone)
    for gpu, lines in logs.items():
        records = [json.loads(x) for x in lines if x.startswith("{")]
        summed = [r for r in records if r.get("event") == "aggregated" and r.get("attempt") == done["attempt"]]
        assert summed and summed[-1]["received"] > 0, (gpu, records[-3:])  # the new attempt summed at an aggregator
        assert records[-1]["event"] == "done" and records[-1]["check"] == "ok", gpu  # every sum exact
    freed = {"event": "ended", "job": key, "freed_bytes": agg["bytes"]}  # the old attempt's pool, at the fail-over
    log = RUN_DIR / f"aggregator-{old}.log"
    assert freed in [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")], old
    ended = {"event": "ended", "job": key, "freed_bytes": 0}  # at the end, where the new attempt summed (it left)
    log = RUN_DIR / f"aggregator-{agg['switch']}.log"
    wait_for(lambda: ended in [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")], 10,
             f"{agg['switch']}'s aggregator to log the job's end")
    rack_cli("server", "start", "srv2")
    seen_up(client, "srv2")


def test_a_controller_killed_in_the_middle_of_a_recovery_from_a_server_death(fresh):
    """kill -9 of the controller once the recovery from srv2's death is assessed (held there by the fault hook): the
    new controller observes the servers again (srv2 down), takes a spare and the job ends done; it does not wait
    beside free GPUs for one held by the dead server."""
    client = fresh.restart("--optirack-fault-hold-recovering", "assessed")
    job = _running(client)
    rack_cli("server", "kill", "srv2")
    held = f"{job['id']}: recovery held at step assessed"
    wait_for(lambda: held in fresh.controller.output(), 60, "the recovery held at assessed")
    fresh.controller.kill()
    client = fresh.restart(engines=False)  # srv2 is still dead
    done = _done_on_live_servers(client, job["id"], {"srv2"})
    assert done["recoveries"][-1].get("resumed") and "gpu2" in done["recoveries"][-1]["lost"], done["recoveries"]
    rack_cli("server", "start", "srv2")
    seen_up(client, "srv2")


def test_a_server_that_hangs_is_swapped_out_and_its_stale_workers_are_fenced_when_it_wakes(fresh, driver):
    """Every process of srv2 stopped, links up: nothing refused, no link down. Its rank falls silent and its engine does
    not answer the failure detector's probe: the server is lost (not after the engine client's 3-s timeout), the job
    goes on elsewhere; when srv2 wakes, the controller removes what it ran before its GPUs are free, and nothing it
    prints reaches the job's record."""
    client = fresh.client
    job = _running(client)
    servers.hang(PLANS["srv2"])
    try:
        wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["recoveries"], 60, "the job to recover")
    finally:
        woke_at = time.time()
        servers.wake(PLANS["srv2"])
    rec = client.get(f"/jobs/{job['id']}")["job"]["recoveries"][0]
    assert "gpu2" in rec["lost"] and "(hung)" in rec["lost"]["gpu2"], rec  # the probe's verdict, not a ping timeout
    seen_up(client, "srv2")  # swept, then up
    assert [w for w in driver.workers("srv2") if w["job"] == job["id"]] == []  # its stale workers removed
    done = _done_on_live_servers(client, job["id"], {"srv2"})
    after = [r for r in client.get(f"/jobs/{job['id']}")["job"]["ranks"].get("gpu2", []) if r["t_start"] > woke_at]
    assert after == [], after  # fenced: nothing of the woken worker recorded
    assert "gpu2" not in done["gpus"]


def test_a_slow_rank_is_reported_a_stopped_one_restarted_and_a_hung_server_swapped(fresh):
    """One test, so that it can fail each way: gpu2's emulated GPU throttled 4x: still progressing while its engine
    answers, it is reported (the job's `lagging`) and not swapped; the same worker stopped outright (SIGSTOP): after the
    longer deadline it is a hung worker, lost as a killed one is; then the whole server of a rank hung: swapped."""
    client = fresh.client
    job = _running(client, body={**JOB, "workload": {"iterations": 400, "compute_seconds": 0.05}})
    servers.throttle(RACK, job["id"], "gpu2", 4)
    wait_for(lambda: "gpu2" in client.get(f"/jobs/{job['id']}")["job"].get("lagging", {}), 60, "gpu2 reported")
    j = client.get(f"/jobs/{job['id']}")["job"]
    assert j["state"] == "running" and not j["recoveries"] and "compute" in j["lagging"]["gpu2"], j["lagging"]
    stopped_at = time.time()
    os.kill(servers.worker_pid(RACK, job["id"], "gpu2"), signal.SIGSTOP)
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["recoveries"], 60, "the stopped worker to be lost")
    rec = client.get(f"/jobs/{job['id']}")["job"]["recoveries"][0]
    assert "(hung)" in rec["lost"]["gpu2"] and "while its server answers" in rec["lost"]["gpu2"], rec
    # the longer deadline (detect.HUNG_MIN_S, 5 s from its last line), not the probe's (under a second)
    assert rec["detected_at"] - stopped_at >= 4.0, rec
    j = client.get(f"/jobs/{job['id']}")["job"]
    victim = next(g for g in j["gpus"] if RACK.server_of[g] != "srv2")
    server = RACK.server_of[victim]
    servers.hang(PLANS[server])
    try:
        wait_for(lambda: len(client.get(f"/jobs/{job['id']}")["job"]["recoveries"]) == 2, 60, "the hung server")
    finally:
        servers.wake(PLANS[server])
    second = client.get(f"/jobs/{job['id']}")["job"]["recoveries"][1]
    assert victim in second["lost"] and "(hung)" in second["lost"][victim], second
    seen_up(client, server)
    client.post(f"/jobs/{job['id']}/stop")
    assert wait_job(client, job["id"])["state"] == "stopped"

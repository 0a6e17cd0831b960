"""The paper rack as four machines: one Docker Engine per server, reached over mutual TLS. A job
spread over three servers runs each worker on its own server's engine, holding exactly its NIC;
rack-check asks every engine; engine failures leave nothing behind on any engine; a server killed
under a job is swapped for a spare, twice in one job, or waited for at the head of the queue when no
spare is free; a restarted controller adopts a job that runs on three engines."""
from __future__ import annotations

import subprocess

import pytest

from controller.client import ApiError
from controller.core.circuits import CircuitMap
from controller.core.emulated import netns_of
from controller.core.rack import load_rack
from controller.drivers.containers import container_name, sandbox_name
from emulation import engine_procs, engines, ovs, registry
from emulation import netns as ns
from tests.integration.helpers import BIN, PAPER, ROOT, rack_cli, seen_up, sh, wait_for, wait_job

RACK = load_rack(PAPER)
FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]
SPREAD = ["gpu1", "gpu5", "gpu2", "gpu3"]  # srv1 (2), srv2, srv3: three servers, two switches
PLANS = {p.server: p for p in engines.engine_plans(RACK)}
TLS = RACK.spec.engines.tls


def docker_cli(server: str, *args: str) -> str:
    """The docker CLI against a server's engine over mutual TLS, as a user would."""
    return sh("docker", "-H", PLANS[server].url, "--tlsverify", "--tlscacert", TLS.ca, "--tlscert", TLS.cert,
              "--tlskey", TLS.key, *args)


def ours_on_every_engine(driver) -> dict[str, list]:
    return {s: driver.workers(s) for s in RACK.servers}


def rack_check(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "optirack"), "rack-check", "--rack", str(PAPER), *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_four_engines_answer_over_tls_at_the_rack_files_addresses(bed):
    for server, plan in PLANS.items():
        assert RACK.servers[server].docker == plan.url
        assert docker_cli(server, "info", "--format", "{{.DockerRootDir}}").strip() == str(plan.data_root)
    with pytest.raises(AssertionError, match="exited"):  # no client certificate: refused
        sh("docker", "-H", PLANS["srv1"].url, "--tlsverify", "--tlscacert", TLS.ca, "info")


def test_a_job_over_three_servers_runs_on_their_engines_holding_their_nics_and_regroups(fresh, driver):
    client = fresh.client
    job = client.post(
        "/jobs", {"gpus": SPREAD, "policy": "fixed", "workload": {"iterations": 40, "compute_seconds": 0.05}}
    )["job"]
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["iterations_done"] >= 3, 120, "the job to run")
    for gpu in SPREAD:
        server = RACK.server_of[gpu]
        names = docker_cli(server, "ps", "--format", "{{.Names}}").split()
        assert container_name(job["id"], gpu) in names and sandbox_name(job["id"], gpu) in names
        for other in set(RACK.servers) - {server}:
            assert container_name(job["id"], gpu) not in docker_cli(other, "ps", "-a", "--format", "{{.Names}}")
        inside = docker_cli(server, "exec", container_name(job["id"], gpu), "ip", "-o", "-4", "addr").splitlines()
        assert sorted(line.split()[1] for line in inside) == sorted(["lo", gpu])
        assert f"{RACK.addresses[gpu][0]}/24" in next(line for line in inside if line.split()[1] == gpu)
        assert not ns.has_link(gpu, netns_of(server))
    body = client.post(f"/jobs/{job['id']}/regroup")
    assert len(body["job"]["switches"]) == 1
    done = wait_job(client, job["id"])
    assert done["state"] == "done" and done["iterations_done"] == 40, done["reason"]
    assert done["image"].startswith(f"{RACK.spec.engines.registry}/optirack-worker@sha256:")
    assert all(v == [] for v in ours_on_every_engine(driver).values())
    for gpu in SPREAD:
        assert RACK.addresses[gpu][0] in sh("ip", "-n", netns_of(RACK.server_of[gpu]), "-o", "addr", "show", "dev", gpu)


def test_rack_check_asks_every_engine(fresh, driver):
    out = rack_check()
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("srv")]
    assert [line.split()[0] for line in lines] == list(RACK.servers) and all(" ok: " in line for line in lines)
    assert all("CNI host-device, static" in line for line in lines)
    # one engine stopped
    rack_cli("engine", "stop", "srv3")
    out = rack_check()
    assert out.returncode == 1 and "srv3: engine unreachable" in out.stderr, out.stdout + out.stderr
    rack_cli("engine", "start", "srv3")
    # the plugins missing from one server: its engine lacks the helper that carries them, and the
    # registry is down so it cannot pull it (the others still have theirs)
    helper = f"{RACK.spec.engines.registry}/{RACK.spec.engines.helper_image}"
    for image_id in set(docker_cli("srv2", "images", "-q", helper.rsplit(":", 1)[0]).split()):
        docker_cli("srv2", "rmi", "-f", image_id)
    registry.stop()
    try:
        out = rack_check()
        assert out.returncode == 1 and "srv2: NIC helper" in out.stderr and "not on the engine" in out.stderr, (
            out.stdout + out.stderr
        )
        assert [line.split()[2] for line in out.stdout.splitlines() if line.startswith("srv")] == [
            "ok:",
            "FAIL:",
            "ok:",
            "ok:",
        ]
    finally:
        registry.start(RACK)
    assert rack_check().returncode == 0


def test_an_engine_down_before_submit_is_refused_and_avoided(fresh, driver):
    client = fresh.client
    rack_cli("engine", "stop", "srv2")
    with pytest.raises(ApiError) as info:
        client.post("/jobs", {"gpus": ["gpu1", "gpu2"], "policy": "fixed"})
    assert info.value.status == 409 and "server srv2" in info.value.message and "gpu2" in info.value.message
    wait_for(lambda: not client.get("/topology")["servers"]["srv2"]["engine"]["up"], 10, "srv2 seen down")
    job = client.post("/jobs", {"gpus": 5, "policy": "regroup", "workload": {"iterations": 3}})["job"]
    assert "gpu2" not in job["gpus"]
    assert wait_job(client, job["id"])["state"] == "done"
    rack_cli("engine", "start", "srv2")
    seen_up(client, "srv2")
    assert all(v == [] for v in ours_on_every_engine(driver).values())


def test_an_engine_down_between_admission_and_start_fails_the_job_at_once(bed, driver, fresh):
    bed.restart("--optirack-engine-poll", "3600")  # placement learns of it only at the start
    try:
        client = bed.client
        rack_cli("engine", "stop", "srv3")
        job = client.post("/jobs", {"gpus": 4, "policy": "fixed", "workload": {"iterations": 3}})["job"]
        assert "gpu3" in job["gpus"]  # admitted: the controller had not asked srv3 since
        done = wait_job(client, job["id"], 60)
        assert done["state"] == "failed" and "server srv3" in done["reason"], done["reason"]
        assert all(g["job"] is None for g in client.get("/topology")["gpus"].values())
        rack_cli("engine", "start", "srv3")
        assert all(v == [] for v in ours_on_every_engine(driver).values())
    finally:
        bed.restart()


def test_a_server_killed_mid_job_is_swapped_for_a_spare_and_comes_back_empty(fresh, driver):
    """The failover mechanism once (controller/jobs/failover.py): a whole server dies under a 4-GPU job; the job
    recovers (a spare under its switch, every rank from the checkpoint) and ends done; the server comes back empty."""
    client = fresh.client
    job = client.post(
        "/jobs",
        {"gpus": ["gpu1", "gpu2", "gpu3", "gpu4"], "policy": "regroup", "checkpoint_every": 5,
         "workload": {"iterations": 20, "compute_seconds": 0.1}},
    )["job"]
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["iterations_done"] >= 8, 120, "8 iterations")
    out = rack_cli("server", "kill", "srv2")
    assert "NIC ports down: gpu2-port" in out or "NIC ports down" in out, out
    assert engines.pid_of(PLANS["srv2"]) is None and engine_procs.containerd_pid(PLANS["srv2"]) is None
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["state"] != "running", 10, "the loss to be seen")
    done = wait_job(client, job["id"], 240)
    assert done["state"] == "done" and done["iterations_done"] == 20, (done["state"], done["reason"])
    (rec,) = done["recoveries"]
    assert set(rec["lost"]) == {"gpu2"} and rec["spares"]["gpu2"] in ("gpu5", "gpu6"), rec
    assert 5 <= rec["resumed_from"] and rec["iterations_redone"] <= 5, rec
    assert "gpu2" not in done["gpus"] and len(done["switches"]) == 1, done
    ranks = client.get(f"/jobs/{job['id']}")["job"]["checkpoints"]
    restored = {g: [r for r in ranks[g] if r["event"] == "restored"] for g in done["gpus"]}
    assert all(len(r) == 1 and r[0]["iteration"] == rec["resumed_from"] for r in restored.values()), restored
    assert all(g["job"] is None for g in client.get("/topology")["gpus"].values())
    out = rack_cli("server", "start", "srv2")  # back, empty: nothing of the failed attempt on any engine
    seen_up(client, "srv2")
    assert driver.workers("srv2") == [] and all(v == [] for v in ours_on_every_engine(driver).values())
    assert RACK.addresses["gpu2"][0] in sh("ip", "-n", "optirack-srv2", "-o", "addr", "show", "dev", "gpu2")
    again = client.post("/jobs", {"gpus": ["gpu2", "gpu4"], "workload": {"iterations": 3, "compute_seconds": 0.05}})
    assert wait_job(client, again["job"]["id"])["state"] == "done"  # its GPU is free, and works


def where_the_ocs_puts(gpus: list[str]) -> set[str]:
    """The switches the OCS bridge's own flows (not the controller's map) cable `gpus` under."""
    pairs = [[f"ocs1:{a}", f"ocs1:{b}"] for a, b in ovs.circuits_of(ovs.circuit_flows("ocs1"))]
    where = CircuitMap.parse(RACK, pairs).gpu_locations(RACK)
    return {where[g][0] if g in where else f"{g} uncabled" for g in gpus}


def saved_in(job: dict, attempt: int, after: int) -> bool:
    """Whether every rank of `job` has saved a checkpoint past iteration `after` in `attempt`."""
    return all(
        any(r["event"] == "checkpoint" and r.get("attempt") == attempt and r["iteration"] > after
            for r in job["checkpoints"][g])
        for g in job["gpus"]
    )


def died(why: str, server: str, gpu: str) -> bool:
    """Whether `why` is a sign of a server death: its engine gone, or its GPU's link down (whichever came first)."""
    return f"server {server} went down" in why or f"the link of {gpu}'s NIC" in why


def check_swap(client, job: dict, rec: dict) -> None:
    """A recovery's circuit change: a `failover` event moving each spare's circuit under the job's switch (none
    where the spare was there already), and every rank restarted from the recovery's checkpoint."""
    if rec["event"] is not None:
        (ev,) = [e for e in client.get("/events", limit=100)["events"] if e["id"] == rec["event"]]
        assert ev["kind"] == "failover" and ev["status"] == "ok" and ev["job"] == job["id"], ev
        for lost, spare in rec["spares"].items():
            assert f"{lost} -> {spare}" in ev["reason"], ev
    restored = {g: [r["iteration"] for r in job["checkpoints"][g]
                    if r["event"] == "restored" and r.get("attempt") == rec["attempt"]]
                for g in rec["gpus"] if g in job["gpus"]}  # (a GPU lost later has left the record's ranks)
    assert len(restored) >= 2 and all(v == [rec["resumed_from"]] for v in restored.values()), (rec, restored)


def test_two_servers_killed_one_after_the_other_in_one_job_are_both_recovered(fresh, driver):
    """Two losses in one job: srv2 dies, the job goes on with a spare; once every rank has saved a checkpoint in the
    new attempt, srv4 dies under one of its ranks; it goes on again with the other spare and ends done, the record
    holding both swaps, each from the newest checkpoint of which a copy survived."""
    client = fresh.client
    job = client.post(
        "/jobs",
        {"gpus": ["gpu1", "gpu2", "gpu3", "gpu4"], "policy": "regroup", "checkpoint_every": 4,
         "workload": {"model": "resnet50", "iterations": 40, "compute_seconds": 0.05}},
    )["job"]
    jid = job["id"]
    wait_for(lambda: saved_in(client.get(f"/jobs/{jid}")["job"], 0, 0), 120, "a first checkpoint")
    rack_cli("server", "kill", "srv2")
    wait_for(lambda: client.get(f"/jobs/{jid}")["job"]["recoveries"], 60, "the first recovery")
    first = client.get(f"/jobs/{jid}")["job"]["recoveries"][0]
    assert set(first["lost"]) == {"gpu2"} and died(first["lost"]["gpu2"], "srv2", "gpu2"), first
    wait_for(lambda: saved_in(client.get(f"/jobs/{jid}")["job"], first["attempt"], first["resumed_from"]), 120,
             "a checkpoint of the new attempt on every rank")
    assert "gpu4" in client.get(f"/jobs/{jid}")["job"]["gpus"]
    rack_cli("server", "kill", "srv4")
    done = wait_job(client, jid, 240)
    assert done["state"] == "done" and done["iterations_done"] == 40, (done["state"], done["reason"])
    first, second = done["recoveries"]
    assert set(second["lost"]) == {"gpu4"} and died(second["lost"]["gpu4"], "srv4", "gpu4"), second
    assert {first["spares"]["gpu2"], second["spares"]["gpu4"]} == {"gpu5", "gpu6"}  # the free Titan V, in turn
    assert second["resumed_from"] > first["resumed_from"] and second["attempt"] > first["attempt"]
    assert set(second["gpus"]) == set(first["gpus"]) - {"gpu4"} | {second["spares"]["gpu4"]}, (first, second)
    assert set(done["gpus"]) == {"gpu1", "gpu3", "gpu5", "gpu6"} and len(done["switches"]) == 1, done
    full = client.get(f"/jobs/{jid}")["job"]
    for rec in (first, second):
        # redone: at most K (4), plus those run while the newest save was still on its way to its peer
        assert rec["switches"] == done["switches"] and 0 <= rec["iterations_redone"] < 8, rec
        check_swap(client, full, rec)
    assert second["event"] is not None  # the second spare was under the other switch: its circuit moved
    assert where_the_ocs_puts(done["gpus"]) == set(done["switches"])
    assert all(g["job"] is None for g in client.get("/topology")["gpus"].values())
    for server in ("srv2", "srv4"):  # back, empty
        rack_cli("server", "start", server)
    seen_up(client, "srv2", "srv4")
    assert all(v == [] for v in ours_on_every_engine(driver).values())


def test_a_job_with_no_spare_waits_at_the_head_of_the_queue_and_goes_on_when_a_gpu_frees(fresh, driver):
    """A job of three M40 (gpu_model M40) loses srv2 while the fourth M40 runs another job: no spare of its model is
    free, so it waits at the head of the queue with its checkpoint, and a job submitted then stays queued behind it
    though a Titan V is free. The other job stopped, the job takes its M40 (moved under its switch), goes on from the
    checkpoint and ends done; the queued job starts once it has its spare, before it ends."""
    client = fresh.client
    job = client.post(
        "/jobs",
        {"gpus": ["gpu1", "gpu2", "gpu3"], "gpu_model": "M40", "policy": "regroup", "checkpoint_every": 4,
         "workload": {"model": "resnet50", "iterations": 40, "compute_seconds": 0.05}},
    )["job"]
    jid = job["id"]
    other = client.post("/jobs", {"gpus": ["gpu4", "gpu5"], "policy": "fixed",
                                  "workload": {"model": "resnet50", "iterations": 100000, "compute_seconds": 0.05}})
    oid = other["job"]["id"]
    wait_for(lambda: saved_in(client.get(f"/jobs/{jid}")["job"], 0, 0), 120, "a first checkpoint")
    assert client.get(f"/jobs/{oid}")["job"]["state"] == "running"
    rack_cli("server", "kill", "srv2")
    wait_for(lambda: "waiting at the head of the queue" in (client.get(f"/jobs/{jid}")["job"]["note"] or ""), 60,
             "the job to wait for a spare")
    waiting = client.get(f"/jobs/{jid}")["job"]
    assert waiting["state"] == "recovering" and waiting["gpus"] == ["gpu1", "gpu3"], waiting
    assert "of model M40" in waiting["note"], waiting["note"]
    later = client.post("/jobs", {"gpus": 1, "workload": {"model": "resnet50", "iterations": 3}})["job"]
    assert later["state"] == "queued" and "waiting for spares ahead of it" in later["note"], later
    assert client.get("/topology")["gpus"]["gpu6"]["job"] is None  # free, and still not taken
    client.post(f"/jobs/{oid}/stop")
    done = wait_job(client, jid, 240)
    assert done["state"] == "done" and done["iterations_done"] == 40, (done["state"], done["reason"])
    (rec,) = done["recoveries"]
    assert rec["spares"] == {"gpu2": "gpu4"} and "waited_from" in rec and rec["resumed_from"] >= 4, rec
    check_swap(client, client.get(f"/jobs/{jid}")["job"], rec)
    stopped = client.get(f"/jobs/{oid}")["job"]
    assert stopped["state"] == "stopped" and rec["planned_at"] >= stopped["ended_at"], (rec, stopped)  # given back
    assert where_the_ocs_puts(done["gpus"]) == set(done["switches"]) and len(done["switches"]) == 1
    queued = wait_job(client, later["id"])
    assert queued["state"] == "done" and queued["gpus"][0] in ("gpu5", "gpu6"), queued
    assert queued["started_at"] < done["ended_at"]  # it went once the job had its spare, not when it ended
    rack_cli("server", "start", "srv2")
    seen_up(client, "srv2")
    assert all(v == [] for v in ours_on_every_engine(driver).values())


def test_a_restarted_controller_adopts_a_job_on_three_engines(fresh, driver):
    client = fresh.client
    job = client.post(
        "/jobs",
        {
            "gpus": SPREAD,
            "policy": "regroup",
            "workload": {"model": "resnet50", "iterations": 60, "compute_seconds": 0.1},
        },
    )["job"]
    wait_for(lambda: client.get(f"/jobs/{job['id']}")["job"]["iterations_done"] >= 3, 120, "the job to run")
    before = {  # its ranks' workers (its warm spares, one per GPU model, wait on other GPUs)
        s: sorted(w["gpu"] for w in driver.workers(s, job["id"]) if w["role"] == "worker" and w["gpu"] in SPREAD)
        for s in ("srv1", "srv2", "srv3")
    }
    assert before == {"srv1": ["gpu1", "gpu5"], "srv2": ["gpu2"], "srv3": ["gpu3"]}
    client = fresh.restart()  # about 2 s; the job has some 50 iterations of about 0.2 s to go
    assert client.get(f"/jobs/{job['id']}")["job"]["state"] == "running"
    done = wait_job(client, job["id"])
    assert done["state"] == "done" and done["iterations_done"] == 60, done["reason"]
    assert all(v == [] for v in ours_on_every_engine(driver).values())

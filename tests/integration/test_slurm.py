"""Slurm schedules the rack, optirack wires it: a real slurmctld (with slurmdbd) and four slurmd, one in each
server of the shared testbed, with optirack's PrologSlurmctld/EpilogSlurmctld calling the testbed's controller.
Nothing here is a mock: sbatch, srun, scancel and sacct are Slurm's own, and a node is lost by killing its server.

Every test shares one run of the rack (`endings`): two jobs on every GPU first, then the ways a job ends, one after the
other (a scancel, a hold then a requeue, an end while the controller is down, a lost node), all but the first side by
side with a job with a one-minute limit; each test then checks its own, or raises what stopped its part of the run."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from controller.cli import main as optirack
from controller.core.circuits import CircuitMap
from controller.core.emulated import netns_of
from controller.slurm.conf import topology_conf
from emulation import engines, ovs, servers
from emulation import slurm as slurmmod
from emulation.rack import CONTAINER_LABEL
from tests.integration.helpers import BIN, PAPER, ROOT, wait_for

TRAIN = ROOT / "scripts" / "slurm" / "train.sbatch"


@pytest.fixture(scope="module")
def _slurm_stopped_after(testbed):
    yield
    removed = slurmmod.stop()
    assert not slurmmod.LAYOUT.root.exists() and not slurmmod.daemon_pids(), removed


def _slurm_up(testbed) -> None:
    """Slurm on the shared testbed's rack, its hooks pointed at the testbed's controller: started once, and again
    if the testbed was rebuilt meanwhile (its rack-down stops Slurm too)."""
    running = slurmmod.daemon_pids()
    if "slurmctld" not in running or sum(n.startswith("slurmd ") for n in running) < len(testbed.rack.servers):
        hook = slurmmod.Hook(str(BIN / "optirack-slurm-hook"), testbed.controller.url,
                             str(testbed.controller.state_dir / "token"))
        slurmmod.start(testbed.rack, hook)




def run(*cmd: str) -> str:
    return slurmmod.run(*cmd, timeout=60).stdout


def sbatch(tmp_path: Path, *args: str, script: Path | None = None, wrap: str | None = None) -> str:
    env_args = ["--export", f"ALL,OPTIRACK_VENV={BIN.parent},OPTIRACK_RACK={PAPER},ITERATIONS=3"]
    where = ["--chdir", str(tmp_path), "--output", str(tmp_path / "slurm-%j.out")]
    body = ["--wrap", wrap] if wrap else [str(script)]
    out = run("sbatch", "--parsable", *env_args, *where, *args, *body)
    return out.strip().split(";")[0]


def in_queue(job: str) -> bool:
    return bool(run("squeue", "--noheader", "--jobs", job, "--format=%i").strip())


def sacct(*jobs: str) -> dict[str, dict]:
    out = run("sacct", "--parsable2", "--allusers", "--format", "JobID,State,Comment", "--jobs", ",".join(jobs),
              "-X")
    lines = out.strip().splitlines()
    names = lines[0].split("|")
    return {r["JobID"]: r for r in (dict(zip(names, line.split("|", len(names) - 1), strict=True))
                                    for line in lines[1:])}  # the last field, the comment, may hold a "|"


def _switches_on_flows(rack, flows_text: str, gpus: list[str]) -> set[str]:
    """The switches `gpus` hang under in a dump of the OCS bridge's flows (ovs-ofctl dump-flows)."""
    pairs = ovs.circuits_of(ovs.flow_pairs(flows_text))
    circuits = CircuitMap.parse(rack, [[f"ocs1:{a}", f"ocs1:{b}"] for a, b in pairs])
    where = circuits.gpu_locations(rack)
    return {where[g][0] for g in gpus if g in where}


def _leftovers(rack, job: str | None = None) -> list[str]:
    """Processes of jobs (slurmstepd and what it ran; of `job`: its slurmstepds) still in a server's namespace."""
    spaces = {os.stat(f"/run/netns/{netns_of(s)}").st_ino for s in rack.servers}
    found = []
    for p in slurmmod._steps_in(spaces):
        try:
            found.append(open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:80])
        except OSError:
            continue
    return [c for c in found if job is None or f"[{job}." in c]


def _regrouped_and_released(bed, tmp_path: Path) -> dict:
    """Two sbatch jobs across both switches: regrouped before their batch scripts and first iterations, released."""
    rack = bed.rack
    script = tmp_path / "job.sbatch"  # the OCS bridge's own flows as the batch script starts, then the example
    script.write_text(f"#!/bin/bash\novs-ofctl -O OpenFlow13 dump-flows ocs1 > {tmp_path}/$SLURM_JOB_ID.flows\n"
                      f"exec bash {TRAIN}\n")
    four = sbatch(tmp_path, "-N4", "--ntasks-per-node=1", "--gres=gpu:m40:1", script=script)
    two = sbatch(tmp_path, "-N2", "--ntasks-per-node=1", "--gres=gpu:titanv:1", script=script)
    wait_for(lambda: not in_queue(four) and not in_queue(two), 120, "both jobs to end")
    jobs = {j["id"]: j for j in bed.client.get("/jobs")["jobs"]}
    mine = {"four": jobs[f"slurm-{four}"], "two": jobs[f"slurm-{two}"]}
    assert mine["four"]["gpus"] == ["gpu1", "gpu2", "gpu3", "gpu4"]  # Slurm's allocation spans both switches
    start = CircuitMap.initial(rack).gpu_locations(rack)
    assert {start[g][0] for g in mine["four"]["gpus"]} == {"as1", "as2"}
    for name, job in mine.items():
        slurm_id = job["request"]["external"]["job"]
        assert job["state"] == "done" and len(job["switches"]) == 1, (name, job)
        assert job["request"]["external"]["user"] == "root" and job["request"]["external"]["state"] == "COMPLETED"
        # before the batch script ran, the OCS bridge already held the job's GPUs under its one switch
        flows = (tmp_path / f"{slurm_id}.flows").read_text()
        assert _switches_on_flows(rack, flows, job["gpus"]) == set(job["switches"]), flows
        lines = [json.loads(x) for x in (tmp_path / f"slurm-{slurm_id}.out").read_text().splitlines()
                 if x.startswith("{")]
        firsts = [x["t_start"] for x in lines if x.get("event") == "iteration" and x["iteration"] == 0]
        assert len(firsts) == len(job["gpus"]) and sum(x.get("event") == "done" for x in lines) == len(job["gpus"])
        events = {e["id"]: e for e in bed.client.get("/events", limit=100)["events"]}
        if name == "four":  # its regroup was one circuit change, confirmed before any rank's first iteration
            (ev,) = [events[i] for i in job["events"]]
            assert ev["status"] == "ok" and ev["flows_confirmed_at"] < min(firsts)
    # the prolog's comment reaches slurmdbd by its own message, which may follow the job's end by a moment
    try:
        wait_for(lambda: "under as" in sacct(four)[four]["Comment"], 15, f"sacct to show job {four}'s comment",
                 interval=0.5)
    except TimeoutError:
        pass  # the assertion below says what sacct shows
    done = sacct(four, two)
    assert done[four]["State"] == done[two]["State"] == "COMPLETED", done
    assert "under as" in done[four]["Comment"], done[four]
    # Slurm saw the fabric change: the controller rewrote topology.conf from the live circuits
    live = CircuitMap.parse(rack, bed.client.get("/ocs/circuits")["circuits"])
    assert topology_conf(rack, live) != topology_conf(rack, CircuitMap.initial(rack))  # srv3, srv4 moved to as1
    wait_for(lambda: slurmmod.LAYOUT.topology.read_text() == topology_conf(rack, live), 5, "topology.conf")
    # released: no job holds them, so the rack's starting circuits can be put back at once, and a change made
    # through REST reaches Slurm's tree as well
    assert not [j for j in bed.client.get("/jobs")["jobs"] if j["state"] in ("running", "configuring")]
    bed.client.put("/ocs/circuits", {"circuits": bed.initial})
    assert bed.containers() == [] and _leftovers(rack) == []
    wait_for(lambda: slurmmod.LAYOUT.topology.read_text() == topology_conf(rack, CircuitMap.initial(rack)), 5,
             "topology.conf to follow the change made through REST")
    # the file is written before `scontrol reconfigure` runs, so wait for that reload to end before counting
    def reloaded():
        kept = bed.client.get("/slurm/topology")
        return kept if kept["in_flight"] == 0 and kept["reconfigures"] + kept["failed"] >= 2 else None

    kept = wait_for(reloaded, 70, "slurmctld to reload the tree written after the REST change")
    brief = {k: v for k, v in kept.items() if k != "history"} | {"last": kept["history"][-2:]}
    assert kept["kept"] and kept["reconfigures"] >= 2 and kept["failed"] == 0 and kept["most_in_flight"] == 1, brief
    # the simulator replays this run's own accounting
    dump = tmp_path / "sacct.txt"
    dump.write_text(run("sacct", "--parsable2", "--allusers", "--format",
                        "JobID,User,Submit,Start,End,State,AllocTRES", "--jobs", f"{four},{two}"))
    out = tmp_path / "sim"
    assert optirack(["simulate", "--rack", str(PAPER), "--trace", str(dump), "--trace-format", "sacct",
                     "--out", str(out), "--quiet", "--no-plots", "--policies", "regroup"]) == 0
    workload = json.loads((out / "results.json").read_text())["workload"]
    assert workload["format"] == "sacct" and workload["jobs"] == 2, workload
    return {"jobs": mine}


def _scancel(bed, tmp_path: Path) -> dict:
    job = sbatch(tmp_path, "-N2", "--ntasks-per-node=1", "--gres=gpu:m40:1", wrap="sleep 300")
    ours = f"slurm-{job}"
    wait_for(lambda: bed.client.get(f"/jobs/{ours}")["job"]["state"] == "running"
             if any(j["id"] == ours for j in bed.client.get("/jobs")["jobs"]) else False, 60, f"{ours} to run")
    run("scancel", job)
    wait_for(lambda: not in_queue(job), 30, "the job to leave")
    left = time.time()
    ended = wait_for(lambda: bed.client.get(f"/jobs/{ours}")["job"]["ended_at"], 10, f"{ours} to be released")
    assert ended <= left + 2.0
    record = bed.client.get(f"/jobs/{ours}")["job"]
    assert record["state"] == "stopped" and record["request"]["external"]["state"].startswith("CANCELLED"), record
    assert _leftovers(bed.rack, job) == []
    return {"job": job, "record": record}


# --- every ending, side by side ----------------------------------------------------------------------------------
def _squeue(job: str) -> str:
    return run("squeue", "--noheader", "--states=all", "--jobs", job, "--format=%T").strip()


def _record(client, job: str) -> dict:
    return client.get(f"/jobs/slurm-{job}")["job"]


def _holds(client, job: str) -> bool:
    return any(j["id"] == f"slurm-{job}" and j["state"] == "running" for j in client.get("/jobs")["jobs"])


def _shown(job: str, key: str) -> str:
    m = re.search(rf"(?:^|\s){key}=(.*?)(?:\s+\w+=|$)", run("scontrol", "show", "job", job), re.M)
    return m.group(1) if m else ""


def _phase(seen: dict, name: str, fn, *args) -> None:
    """One ending's run: what it saw, or the error that stopped it (its test raises it; the others go on)."""
    try:
        seen[name] = fn(*args)
    except Exception as e:  # noqa: BLE001 (handed to that ending's test)
        seen[name] = e


def _hold_then_requeue(testbed, tmp: Path) -> dict:
    client = testbed.client  # a job of optirack's own holds gpu2 (Slurm does not know of it)
    mine = client.post("/jobs", {"gpus": ["gpu2"], "policy": "fixed", "warm_spares": 0,
                                 "workload": {"iterations": 100000}})["job"]["id"]
    try:
        wait_for(lambda: client.get(f"/jobs/{mine}")["job"]["state"] == "running", 60, f"{mine} to run")
        # gpu2 (as1) and gpu3 (as2), asking to wait rather than run fragmented
        job = sbatch(tmp, "-N2", "-w", "srv2,srv3", "--ntasks-per-node=1", "--gres=gpu:m40:1", "--comment",
                     "optirack:hold", wrap="sleep 2")
        wait_for(lambda: int(_shown(job, "Restarts") or 0) >= 1, 30, f"job {job} to be requeued")
        held = {"comment": _shown(job, "Comment"), "state": _squeue(job), "held_record": _record(client, job)
                if any(j["id"] == f"slurm-{job}" for j in client.get("/jobs")["jobs"]) else None}
    finally:
        client.post(f"/jobs/{mine}/stop")
        # stopped once its worker is gone and gpu2's NIC is back at home (the lost node's run may get gpu2 next)
        wait_for(lambda: client.get(f"/jobs/{mine}")["job"]["ended_at"] and not testbed.containers(), 60,
                 f"{mine} to stop")
    wait_for(lambda: not in_queue(job), 60, f"job {job} to run again and end")
    return {"job": job, "blocker": mine, **held, "sacct": sacct(job)[job], "record": _record(client, job)}


def _ended_while_down(testbed, tmp: Path) -> dict:
    flag = tmp / "end-now"
    job = sbatch(tmp, "-w", "srv4", "--gres=gpu:m40:1", wrap=f"while [ ! -e {flag} ]; do sleep 0.1; done")
    wait_for(lambda: _holds(testbed.client, job), 30, f"the controller to hold job {job}")
    testbed.controller.stop()
    try:
        other = sbatch(tmp, "-N1", "--gres=gpu:titanv:1", wrap="true")  # one that starts while it is down
        wait_for(lambda: not in_queue(other), 60, f"job {other} to end")
        flag.touch()
        wait_for(lambda: not in_queue(job), 30, f"job {job} to end")
    finally:
        client = testbed.restart()
    record = wait_for(lambda: (r := _record(client, job))["ended_at"] and r, 30, f"slurm-{job} to be reconciled")
    return {"job": job, "record": record, "busy": client.get("/jobs")["jobs"], "other": sacct(other)[other]}


def _empty_queue() -> None:
    """Every job left in Slurm's queue cancelled, and gone."""
    left = run("squeue", "--noheader", "--format=%i").split()
    if left:
        slurmmod.run("scancel", *left, check=False)
        wait_for(lambda: not run("squeue", "--noheader", "--format=%i").strip(), 60, "the jobs to leave")


def _back_to_start(bed) -> None:
    """No job in Slurm's queue or running in the controller, and the rack's starting circuits: so that a phase that
    failed midway (its jobs still queued, its regroup not put back) does not fail the phases after it as well."""
    _empty_queue()
    wait_for(lambda: not [j for j in bed.client.get("/jobs")["jobs"] if j["state"] in ("running", "configuring")],
             60, "the controller's jobs to be released")
    bed.client.put("/ocs/circuits", {"circuits": bed.initial})


@pytest.fixture(scope="module")
def endings(testbed, _slurm_stopped_after, tmp_path_factory):
    """One run of the rack for every test here: first two jobs on every GPU; then the other endings one after the
    other (each needs GPUs the next would take), all but the first beside a job with a one-minute limit."""
    from scripts.slurm_failover import lost_node

    testbed.clean()
    _slurm_up(testbed)
    tmp = tmp_path_factory.mktemp("endings")
    tmp.chmod(0o755)
    seen: dict = {}
    _phase(seen, "regrouped", _regrouped_and_released, testbed, tmp)
    try:
        _back_to_start(testbed)  # whatever that phase left (it ends so when it passes), the next start as it did
        _phase(seen, "scancel", _scancel, testbed, tmp)
        # a job with a one-minute limit runs beside the other endings (Slurm ends it 60-90 s after its start: it
        # looks at time limits every 30 s); the controller's restart below comes well before that, so that its
        # epilog (not the restart's reconciling) releases it
        limited = sbatch(tmp, "--time=1", "-w", "srv1", "--gres=gpu:titanv:1", wrap="sleep 300")
        t0 = time.time()
        wait_for(lambda: _holds(testbed.client, limited), 30, f"the controller to hold job {limited}")
        _phase(seen, "hold", _hold_then_requeue, testbed, tmp)
        _phase(seen, "down", _ended_while_down, testbed, tmp)
        seen["limit_running_after_restart"] = _holds(testbed.client, limited)
        _phase(seen, "lost", lambda: lost_node(testbed.client, testbed.rack, tmp, BIN.parent, PAPER, gpus=4,
                                               iterations=20, every=5, kill_after=8, victims=("srv2", "srv4"),
                                               log=lambda _: None))

        def limit():
            wait_for(lambda: not in_queue(limited), max(1.0, t0 + 150 - time.time()), f"job {limited} to time out")
            return {"job": limited, "sacct": sacct(limited)[limited], "record": _record(testbed.client, limited)}

        _phase(seen, "limit", limit)
        yield seen
    finally:
        _empty_queue()
        for server in testbed.rack.servers:  # a lost node's server comes back
            plan = next(e for e in engines.engine_plans(testbed.rack) if e.server == server)
            if engines.pid_of(plan) is None:
                servers.start(testbed.rack, plan, f"{CONTAINER_LABEL}={testbed.rack.name}")
        testbed.clean()


def _seen(endings: dict, name: str) -> dict:
    if isinstance(endings.get(name), Exception):
        raise endings[name]
    return endings[name]


def test_sbatch_jobs_are_regrouped_before_their_first_iteration_and_released_after(endings):
    _seen(endings, "regrouped")  # its checks are in the run (_regrouped_and_released)


def test_scancel_releases_the_circuits_at_once(endings):
    _seen(endings, "scancel")  # its checks are in the run (_scancel)


def test_a_time_limit_ends_the_job_and_the_controller_releases_it(endings):
    r = _seen(endings, "limit")
    assert endings["limit_running_after_restart"], "it ended before the controller's restart was over"
    assert r["sacct"]["State"] == "TIMEOUT", r
    assert r["record"]["state"] == "failed" and r["record"]["reason"] == "slurm: TIMEOUT", r["record"]  # its epilog
    assert r["record"]["ended_at"]


def test_a_held_job_is_requeued_and_later_runs_under_one_switch(endings):
    r = _seen(endings, "hold")
    assert "held until its GPUs can be regrouped" in r["comment"], r
    assert f"gpu2 is held by {r['blocker']}" in r["comment"], r  # by a job of optirack's own
    assert r["held_record"] is None  # while held, the controller placed nothing for it
    assert r["sacct"]["State"] == "COMPLETED", r
    rec = r["record"]
    assert rec["state"] == "done" and rec["gpus"] == ["gpu2", "gpu3"] and len(rec["switches"]) == 1, rec
    assert rec["events"], rec  # gpu2 (as1) and gpu3 (as2) were brought under one switch by a circuit change


def test_a_job_that_ends_while_the_controller_is_down_is_released_on_its_restart(endings):
    r = _seen(endings, "down")
    rec = r["record"]
    assert rec["state"] == "done" and rec["request"]["external"]["state"] == "COMPLETED", rec
    assert not [j for j in r["busy"] if j["state"] in ("running", "configuring") and "gpu4" in j["gpus"]]
    # the job that started meanwhile ran as Slurm placed it, and its comment says why
    assert r["other"]["State"] == "COMPLETED", r["other"]
    assert "not regrouped" in r["other"]["Comment"] and "cannot reach the controller" in r["other"]["Comment"]


def test_a_lost_node_requeues_the_job_at_once_and_it_goes_on_from_its_checkpoint_under_one_switch(endings):
    r = _seen(endings, "lost")
    assert r["kill"]["slurm"]["slurmd"] == 1 and r["kill"]["slurm"]["steps"] >= 2, r["kill"]  # a step and its rank
    assert r["final"] == "COMPLETED", r
    assert r["requeued_s"] <= 2.0, r["states_seen"]  # the controller told Slurm; Slurm alone waits SlurmdTimeout
    assert r["victim"] not in r["again_nodes"] and len(r["record"]["switches"]) == 1, r
    assert r["resumed_from"] == r["saved_before_kill"] >= r["checkpoint_every"], r
    assert 0 <= r["iterations_lost"] <= r["checkpoint_every"], r
    assert r["record"]["state"] == "done" and r["record"]["gpus"] != r["first_record"]["gpus"], r["record"]

"""Slurm schedules the rack, optirack wires it: a real slurmctld (with slurmdbd) and four slurmd, one in each
server of the shared testbed, with optirack's PrologSlurmctld/EpilogSlurmctld calling the testbed's controller.
Nothing here is a mock: sbatch, srun, scancel and sacct are Slurm's own."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from controller.cli import main as optirack
from controller.core.circuits import CircuitMap
from controller.core.emulated import netns_of
from controller.slurm.conf import topology_conf
from emulation import ovs
from emulation import slurm as slurmmod
from tests.integration.helpers import BIN, PAPER, ROOT, wait_for

TRAIN = ROOT / "scripts" / "slurm" / "train.sbatch"


@pytest.fixture(scope="module")
def _slurm_stopped_after(testbed):
    yield
    removed = slurmmod.stop()
    assert not slurmmod.LAYOUT.root.exists() and not slurmmod.daemon_pids(), removed


@pytest.fixture
def slurm(bed, _slurm_stopped_after):
    """Slurm on the shared testbed's rack, its hooks pointed at the testbed's controller: started once, and again
    if the testbed was rebuilt meanwhile (its rack-down stops Slurm too); stopped after the module."""
    running = slurmmod.daemon_pids()
    if "slurmctld" not in running or sum(n.startswith("slurmd ") for n in running) < len(bed.rack.servers):
        hook = slurmmod.Hook(str(BIN / "optirack-slurm-hook"), str(PAPER), bed.controller.url,
                             str(bed.controller.state_dir / "token"))
        slurmmod.start(bed.rack, hook)
    return slurmmod


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
    return {r["JobID"]: r for r in (dict(zip(names, line.split("|"), strict=True)) for line in lines[1:])}


def _switches_on_flows(rack, flows_text: str, gpus: list[str]) -> set[str]:
    """The switches `gpus` hang under in a dump of the OCS bridge's flows (ovs-ofctl dump-flows)."""
    pairs = ovs.circuits_of(ovs.flow_pairs(flows_text))
    circuits = CircuitMap.parse(rack, [[f"ocs1:{a}", f"ocs1:{b}"] for a, b in pairs])
    where = circuits.gpu_locations(rack)
    return {where[g][0] for g in gpus if g in where}


def _leftovers(rack) -> list[str]:
    """Processes of a job (slurmstepd and what it ran) still in a server's namespace."""
    spaces = {os.stat(f"/run/netns/{netns_of(s)}").st_ino for s in rack.servers}
    return [open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:80] for p in slurmmod._steps_in(spaces)
            if os.path.exists(f"/proc/{p}")]


def test_sbatch_jobs_are_regrouped_before_their_first_iteration_and_released_after(bed, slurm, tmp_path):
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
    done = sacct(four, two)
    assert done[four]["State"] == done[two]["State"] == "COMPLETED", done
    assert "under as" in done[four]["Comment"], done[four]
    # released: no job holds them, so the rack's starting circuits can be put back at once
    assert not [j for j in bed.client.get("/jobs")["jobs"] if j["state"] in ("running", "configuring")]
    bed.client.put("/ocs/circuits", {"circuits": bed.initial})
    assert bed.containers() == [] and _leftovers(rack) == []
    # Slurm saw the fabric change: topology.conf was rewritten from the live circuits after the last change
    assert slurmmod.LAYOUT.topology.read_text() != topology_conf(rack, CircuitMap.initial(rack))
    # the simulator replays this run's own accounting
    dump = tmp_path / "sacct.txt"
    dump.write_text(run("sacct", "--parsable2", "--allusers", "--format",
                        "JobID,User,Submit,Start,End,State,AllocTRES", "--jobs", f"{four},{two}"))
    out = tmp_path / "sim"
    assert optirack(["simulate", "--rack", str(PAPER), "--trace", str(dump), "--trace-format", "sacct",
                     "--out", str(out), "--quiet", "--no-plots", "--policies", "regroup"]) == 0
    workload = json.loads((out / "results.json").read_text())["workload"]
    assert workload["format"] == "sacct" and workload["jobs"] == 2, workload


def test_scancel_releases_the_circuits_at_once(bed, slurm, tmp_path):
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
    assert _leftovers(bed.rack) == []


def test_a_job_started_with_the_controller_stopped_runs_and_says_why(bed, slurm, tmp_path):
    bed.controller.stop()
    try:
        job = sbatch(tmp_path, "-N1", "--gres=gpu:titanv:1", wrap="true")
        wait_for(lambda: not in_queue(job), 60, "the job to end")
        record = sacct(job)[job]
        assert record["State"] == "COMPLETED", record
        assert "not regrouped" in record["Comment"] and "cannot reach the controller" in record["Comment"], record
    finally:
        bed.restart()

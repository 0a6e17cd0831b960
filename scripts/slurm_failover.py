"""A node lost under a running Slurm job, on the emulated rack with Slurm up (docs/slurm.md), as root, rack lock held.

`lost_node` submits the example batch script (scripts/slurm/train.sbatch: `--requeue`, checkpoints every K
iterations into a host directory) as a job of N GPUs, lets it iterate past a checkpoint, kills one of its servers
the way a server dies on the emulated rack (`emulation.servers.kill`: engine, containers, NIC ports, and the node's
slurmd and job steps; nothing tells Slurm), and follows the job until it ends: when Slurm requeued it, where it ran
again, from which iteration, when it iterated again and how it ended. Whether anyone tells Slurm of the dead node is
up to the controller (its Slurm app, `--optirack-slurm-conf`); with `--optirack-slurm-conf none` Slurm finds out
alone, after its SlurmdTimeout. scripts/slurm_experiment.py --failover runs both; tests/integration/test_slurm.py
runs it with the controller's notice.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from emulation import engines, servers, slurm
from emulation.harness import wait_for
from emulation.rack import CONTAINER_LABEL, RackState

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "scripts" / "slurm" / "train.sbatch"
POLL_S = 0.05


# squeue's states of a job not over yet (it lists ended ones too, for MinJobAge)
LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
        "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


def squeue_state(job: str) -> str:
    """`STATE|REASON|NODES` of a job as squeue shows it ('' once slurmctld forgot it)."""
    return slurm.run("squeue", "--noheader", "--jobs", job, "--states=all", "--format=%T|%r|%N",
                     check=False).stdout.strip()


def over(job: str) -> bool:
    return squeue_state(job).split("|")[0] not in LIVE


def sbatch(workdir: Path, venv: Path, rack_file: Path, *args: str, env: dict[str, str] | None = None,
           wrap: str | None = None) -> str:
    exports = ",".join(["ALL", f"OPTIRACK_VENV={venv}", f"OPTIRACK_RACK={rack_file}",
                        *(f"{k}={v}" for k, v in (env or {}).items())])
    body = ["--wrap", wrap] if wrap else [str(TRAIN)]
    out = slurm.run("sbatch", "--parsable", "--export", exports, "--chdir", str(workdir), "--output",
                    str(workdir / "slurm-%j.out"), *args, *body, timeout=60).stdout
    return out.strip().split(";")[0]


def lines(out: Path) -> list[dict]:
    """The workers' JSON lines in a job's output (both runs of a requeued job: train.sbatch appends)."""
    try:
        text = out.read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def completed(records: list[dict], ranks: int, before: float | None = None) -> int:
    """The highest iteration every rank finished (ended before `before`), -1 if none."""
    done: dict[int, int] = {}
    for r in records:
        if r.get("event") == "iteration" and (before is None or r["t_end"] < before):
            done[r["iteration"]] = done.get(r["iteration"], 0) + 1
    full = [i for i, n in done.items() if n >= ranks]
    return max(full) if full else -1


def saved(records: list[dict], ranks: int) -> int:
    """The newest checkpoint every rank reported saved (0 if none)."""
    by: dict[int, int] = {}
    for r in records:
        if r.get("event") == "checkpoint":
            by[r["iteration"]] = by.get(r["iteration"], 0) + 1
    full = [i for i, n in by.items() if n >= ranks]
    return max(full) if full else 0


def ctld_log(job: str, node: str, since: float) -> list[str]:
    """slurmctld's log lines about the job or the node from `since` on: how Slurm saw the loss and the requeue."""
    try:
        text = (slurm.LAYOUT.root / "slurmctld.log").read_text(errors="replace")
    except OSError:
        return []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
    pattern = re.compile(rf"JobId={job}\b|\b{node}\b|sched|backfill")
    return [line for line in text.splitlines() if line[1:20] >= stamp and pattern.search(line)][:200]


def node_gpus(text: str) -> list[str]:
    """`srv[1,3-4]` as node names (squeue's %N)."""
    from controller.slurm.allocation import hostnames

    return hostnames(text) if text else []


def lost_node(client, rack, workdir: Path, venv: Path, rack_file: Path, gpus: int = 4, iterations: int = 40,
              every: int = 5, kill_after: int = 12, victims: tuple[str, ...] | None = None,
              restart_server: bool = True, log=print) -> dict:
    """One round (see the module's docstring); returns what was seen. `victims`: the servers that may be killed
    (the first of them the job runs on; default its last node, not the one its batch script runs on);
    `kill_after`: iterations every rank finished before the kill."""
    job = sbatch(workdir, venv, rack_file, f"--ntasks={gpus}", "--gpus-per-task=1",  # checkpoints: workdir/checkpoints
                 env={"ITERATIONS": str(iterations), "CHECKPOINT_EVERY": str(every)})
    out = workdir / f"slurm-{job}.out"
    result: dict = {"slurm_job": job, "gpus": gpus, "iterations": iterations, "checkpoint_every": every}
    wait_for(lambda: completed(lines(out), gpus) >= kill_after - 1, 120, f"job {job} to iterate {kill_after} times",
             interval=0.2)
    first = squeue_state(job).split("|")
    result["first_nodes"] = node_gpus(first[2] if len(first) > 2 else "")
    result["first_record"] = client.get(f"/jobs/slurm-{job}")["job"]
    victim = next((s for s in victims or result["first_nodes"][:0:-1] if s in result["first_nodes"]), None)
    if victim is None:
        raise RuntimeError(f"job {job} runs on {result['first_nodes']}, none of {victims}")
    plan = next(engines.EnginePlan(**e) for e in RackState.load().engines if e["server"] == victim)
    result["victim"] = victim
    killed = time.time()
    result["kill"] = servers.kill(rack, plan)
    result["killed_at"] = killed
    result["done_before_kill"] = completed(lines(out), gpus, before=killed)
    result["saved_before_kill"] = saved(lines(out), gpus)
    seen, down_at = [], None
    deadline = killed + 180
    while time.time() < deadline:  # until it runs again (or ended)
        state = squeue_state(job)
        now = time.time()
        if state != (seen[-1][1] if seen else None):
            seen.append([round(now - killed, 3), state])
        if down_at is None and "down" in slurm.run("sinfo", "--noheader", "--nodes", victim, "--format=%T",
                                                   check=False).stdout:
            down_at = now
        word = state.split("|")[0]
        if word in ("PENDING", "REQUEUED", "REQUEUE_HOLD") and "requeued_at" not in result:
            result["requeued_at"] = now
        if "requeued_at" in result and word in ("CONFIGURING", "RUNNING"):
            result["started_again_at"] = now
            break
        if word not in LIVE:
            break
        time.sleep(POLL_S)
    result["states_seen"] = seen  # [seconds after the kill, squeue's STATE|REASON|NODES]
    result["node_down_at"] = down_at
    if "started_again_at" not in result:
        raise RuntimeError(f"job {job} was not requeued and started again within 180 s: {seen}")
    again = squeue_state(job).split("|")
    result["again_nodes"] = node_gpus(again[2] if len(again) > 2 else "")
    wait_for(lambda: over(job), 60 + 10 * iterations, f"job {job} to end", interval=0.5)
    records = lines(out)
    resumed = [r for r in records if r.get("event") == "start" and r.get("t", 0) > killed]
    result["resumed_from"] = min((r["start_iteration"] for r in resumed), default=None)
    firsts = [r for r in records if r.get("event") == "iteration" and r["t_start"] > killed]
    if firsts:
        it0 = min(r["iteration"] for r in firsts)
        result["iterating_again_at"] = max(r["t_end"] for r in firsts if r["iteration"] == it0)
    result["iterations_lost"] = (result["done_before_kill"] + 1 - result["resumed_from"]
                                 if result["resumed_from"] is not None else None)
    result["sacct"] = slurm.run("sacct", "-X", "-n", "-P", "--duplicates", "-o", "JobID,State,NodeList,Start,End",
                                "-j", job).stdout.strip().splitlines()
    result["final"] = slurm.run("sacct", "-X", "-n", "-P", "-o", "State", "-j", job).stdout.strip()
    result["record"] = client.get(f"/jobs/slurm-{job}")["job"]
    result["slurmctld_log"] = ctld_log(job, victim, since=killed - 5)
    for key in ("node_down_at", "requeued_at", "started_again_at", "iterating_again_at"):
        if result.get(key) is not None:
            result[key.replace("_at", "_s")] = result[key] - killed
    if restart_server:
        result["server_back"] = servers.start(rack, plan, f"{CONTAINER_LABEL}={rack.name}")
    log(f"  job {job} on {','.join(result['first_nodes'])}: {victim} killed after iteration "
        f"{result['done_before_kill']}; requeued {result.get('requeued_s', float('nan')):.2f} s later, running "
        f"again on {','.join(result['again_nodes'])} at {result['started_again_s']:.2f} s, from iteration "
        f"{result['resumed_from']}, iterating at {result.get('iterating_again_s', float('nan')):.2f} s; "
        f"{result['final']}")
    return result

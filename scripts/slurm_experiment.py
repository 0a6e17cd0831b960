"""Through Slurm on the emulated paper rack (docs/slurm.md), as root under the rack lock:

- `--case a`: the paper's case (a) submitted with sbatch: the 4-GPU job (one M40 on each server, so across both
  switches) beside the 2-GPU job (the Titan Vs, kept where they are with --comment optirack:fixed); fragmented:
  Slurm without optirack's hooks; regrouped: with them. The 4-GPU job's completion (first iteration's start to
  the last one's end, in rack seconds) and the saving, over repeats.
- `--topology-mix`: the same mix of sbatch jobs (GPUs by count, or one GPU on each of two nodes; held for a few
  seconds), all submitted at once, with the hooks, once with topology.conf (the tree from the live circuits,
  reloaded after each change) and once without a topology plugin: circuit changes and dark-window seconds of each,
  and the nodes Slurm chose for each job.
- `--failover`: a node lost under the example batch script's 4-GPU job (`--requeue`, checkpoints every 5 of 40
  iterations; scripts/slurm_failover.py), `--repeats` times with the controller telling Slurm at once (optirack) and
  as many with the controller leaving Slurm alone (`--optirack-slurm-conf none`: Slurm finds the node dead after its
  SlurmdTimeout, 30 s in our slurm.conf); both hold the requeued job for cred_expire (10 s in our slurm.conf): the
  time from the server's death to the job requeued, running again and iterating again, and the iterations lost.
- `--prolog-cost`: `--jobs` sbatch jobs (1 to 4 GPUs, a second or two each) submitted at once with the hooks: each
  PrologSlurmctld's wall time (what it adds to the job's start), slurmctld's answer time to `squeue` (asked every
  0.1 s) while topology.conf is rewritten and reloaded and otherwise, the reloads (`scontrol reconfigure`) and the
  nodes Slurm chose for each job.

Prints the figures and writes a record under results/slurm/ (never overwriting one).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from controller.core.rack import load_rack
from controller.slurm.conf import CRED_EXPIRE_S
from emulation import slurm
from emulation.harness import ControllerProcess, Testbed, wait_for
from evidence.records import ROOT, utc_stamp, versions, write_new
from scripts.stats import percentile

PAPER = ROOT / "topologies" / "paper-testbed.yaml"
TRAIN = ROOT / "scripts" / "slurm" / "train.sbatch"
BIN = Path(sys.executable).parent
# (sbatch's resource options, seconds held): the topology mix, submitted at once in this order. Jobs by GPU count,
# and jobs of one GPU on each of two nodes while srv1 is taken: the lowest-numbered free nodes are then srv2 (as1)
# and srv3 (as2), while as2's leaf alone has two free nodes (srv3, srv4).
ONE_EACH = ("-N2", "--ntasks-per-node=1", "--gres=gpu:1")
MIX = [(("-N1", "--gres=gpu:2"), 14), (ONE_EACH, 3), (("--gpus=1",), 2), (ONE_EACH, 3), (("--gpus=2",), 3),
       (("--gpus=3",), 3), (ONE_EACH, 2), (("--gpus=1",), 2), (("--gpus=4",), 3), (ONE_EACH, 2)]


def log(msg: str) -> None:
    print(msg, flush=True)


def sbatch(workdir: Path, *args: str, iterations: int = 0, wrap: str | None = None) -> str:
    env = f"ALL,OPTIRACK_VENV={BIN.parent},OPTIRACK_RACK={PAPER},ITERATIONS={iterations}"
    body = ["--wrap", wrap] if wrap else [str(TRAIN)]
    out = slurm.run("sbatch", "--parsable", "--export", env, "--chdir", str(workdir), "--output",
                    str(workdir / "slurm-%j.out"), *args, *body, timeout=60).stdout
    return out.strip().split(";")[0]


def queued() -> set[str]:
    return set(slurm.run("squeue", "--noheader", "--format=%i", check=False).stdout.split())


def completion(out: Path, ranks: int) -> float:
    """First iteration's start to the last complete iteration's end (every rank reported it), wall seconds."""
    its: dict[int, list[dict]] = {}
    for line in out.read_text().splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("event") == "iteration":
                its.setdefault(r["iteration"], []).append(r)
    done = [i for i in sorted(its) if len(its[i]) == ranks]
    if not done:
        raise RuntimeError(f"{out}: no iteration reported by all {ranks} ranks")
    return max(r["t_end"] for r in its[done[-1]]) - min(r["t_start"] for r in its[done[0]])


def start_slurm(tb: Testbed, hooks: bool, topology: bool = True) -> None:
    hook = slurm.Hook(str(BIN / "optirack-slurm-hook"), tb.controller.url,
                      str(tb.controller.state_dir / "token")) if hooks else None
    slurm.start(tb.rack, hook, topology=topology, log=lambda _: None)


def case_a_once(tb: Testbed, workdir: Path, iterations: int, regroup: bool) -> dict:
    tb.client.put("/ocs/circuits", {"circuits": [[str(a), str(b)] for a, b in tb.rack.spec.circuits]})
    red = sbatch(workdir, "-N4", "--ntasks-per-node=1", "--gres=gpu:m40:1", iterations=iterations)
    blue = sbatch(workdir, "-N2", "--ntasks-per-node=1", "--gres=gpu:titanv:1", "--comment", "optirack:fixed",
                  iterations=iterations * 20)
    wait_for(lambda: red not in queued(), 120 + 30 * iterations, f"job {red} to end", interval=0.5)
    slurm.run("scancel", blue)
    wait_for(lambda: blue not in queued(), 60, f"job {blue} to end", interval=0.5)
    state = slurm.run("sacct", "-X", "-n", "-P", "-o", "State,Comment", "-j", red).stdout.strip()
    if not state.startswith("COMPLETED"):
        raise RuntimeError(f"job {red}: {state}")
    ours = next((j for j in tb.client.get("/jobs")["jobs"] if j["id"] == f"slurm-{red}"), None)
    wall = completion(workdir / f"slurm-{red}.out", 4)
    return {"slurm_job": red, "regroup": regroup, "completion_rack_s": wall / tb.rack.spec.emulation.time_dilation,
            "switches": ours["switches"] if ours else ["as1", "as2"], "events": ours["events"] if ours else [],
            "sacct": state}


def case_a(tb: Testbed, workdir: Path, repeats: int, iterations: int) -> dict:
    runs = []
    for regroup in (False, True):
        start_slurm(tb, hooks=regroup)
        for rep in range(repeats):
            r = case_a_once(tb, workdir, iterations, regroup)
            log(f"  case (a) {'regrouped' if regroup else 'fragmented'} #{rep + 1}: Slurm job {r['slurm_job']} "
                f"on {','.join(r['switches'])}: {r['completion_rack_s']:.2f} rack s")
            runs.append(r)
    frag = statistics.median(r["completion_rack_s"] for r in runs if not r["regroup"])
    grp = statistics.median(r["completion_rack_s"] for r in runs if r["regroup"])
    summary = {"fragmented_s": frag, "regrouped_s": grp, "saved": 1 - grp / frag}
    log(f"case (a) through sbatch: fragmented {frag:.2f} s, regrouped {grp:.2f} s (medians of {repeats}): "
        f"{100 * summary['saved']:.1f} % saved (paper: 407 s -> 109 s, 73.2 %)")
    return {"iterations": iterations, "repeats": repeats, "runs": runs, "summary": summary}


def mix_once(tb: Testbed, workdir: Path, topology: bool) -> dict:
    tb.client.put("/ocs/circuits", {"circuits": [[str(a), str(b)] for a, b in tb.rack.spec.circuits]})
    start_slurm(tb, hooks=True, topology=topology)
    t0 = time.time()
    jobs = [sbatch(workdir, *args, wrap=f"sleep {s}") for args, s in MIX]
    wait_for(lambda: not (set(jobs) & queued()), 600, "the mix to end", interval=0.5)
    time.sleep(1)  # the last epilog
    ours = {f"slurm-{j}" for j in jobs}
    events = [e for e in tb.client.get("/events", limit=1000)["events"]
              if e.get("job") in ours and e["requested_at"] >= t0]
    changes = sum(len(e["removed"]) + len(e["added"]) for e in events)
    dark = sum(e["dark_window_s"] or 0 for e in events)
    states = slurm.run("sacct", "-X", "-n", "-P", "-o", "State", "-j", ",".join(jobs)).stdout.split()
    return {"topology": topology, "jobs": len(jobs), "states": states, "regroups": len(events),
            "circuit_changes": changes, "dark_window_s": dark, "makespan_s": time.time() - t0,
            "placed": placements(tb, jobs, events)}


def placements(tb: Testbed, jobs: list[str], events: list[dict]) -> list[dict]:
    """Slurm's node choice for each job (sacct's NodeList), the GPUs it got and where optirack wired them."""
    nodes = {}
    for line in slurm.run("sacct", "-X", "-n", "-P", "-o", "JobIDRaw,NodeList,Start,Comment", "-j",
                          ",".join(jobs)).stdout.splitlines():
        jid, node_list, start, comment = (line.split("|", 3) + ["", "", ""])[:4]  # a comment may hold a "|"
        nodes[jid] = {"nodes": node_list, "start": start, "comment": comment}
    out = []
    for j in jobs:
        rec = next((x for x in tb.client.get("/jobs")["jobs"] if x["id"] == f"slurm-{j}"), None) or {}
        moved = sum(len(e["removed"]) + len(e["added"]) for e in events if e.get("job") == f"slurm-{j}")
        out.append({"job": j, **nodes.get(j, {}), "gpus": rec.get("gpus", []), "switches": rec.get("switches", []),
                    "circuit_changes": moved})
    return out


def topology_mix(tb: Testbed, workdir: Path) -> dict:
    runs = []
    for topology in (False, True):
        r = mix_once(tb, workdir, topology)
        log(f"  mix of {r['jobs']} sbatch jobs {'with' if topology else 'without'} topology.conf: "
            f"{r['regroups']} circuit changes of jobs ({r['circuit_changes']} circuits), "
            f"{r['dark_window_s']:.3f} s dark, makespan {r['makespan_s']:.0f} s")
        runs.append(r)
    return {"mix": [[" ".join(args), s] for args, s in MIX], "runs": runs}


def restart_controller(tb: Testbed, extra: list[str]) -> None:
    """The testbed's controller again on its ports and state, with `extra` options."""
    old = tb.controller
    old.stop()
    tb.controller = ControllerProcess(old.state_dir.parent, PAPER, extra, old.of_port, old.rest_port)
    tb.controller.start()
    tb.client = tb.controller.client()
    wait_for(tb._ready, 60, "the controller to resynchronise")


def failover(tb: Testbed, workdir: Path, repeats: int) -> dict:
    from scripts.slurm_failover import lost_node

    rounds = []
    for arm, extra in (("optirack", []), ("slurm alone", ["--optirack-slurm-conf", "none"])):
        restart_controller(tb, extra)
        start_slurm(tb, hooks=True)
        for rep in range(repeats):
            tb.client.put("/ocs/circuits", {"circuits": [[str(a), str(b)] for a, b in tb.rack.spec.circuits]})
            d = workdir / f"failover-{len(rounds)}"
            d.mkdir()
            d.chmod(0o755)
            log(f"  {arm} #{rep + 1}:")
            r = lost_node(tb.client, tb.rack, d, BIN.parent, PAPER, log=log)
            r["arm"] = arm
            rounds.append(r)
            wait_for(lambda v=r["victim"]: slurm.node_states().get(v, "").rstrip("*") == "idle", 120,
                     f"node {r['victim']} to be idle again", interval=0.5)
    restart_controller(tb, [])
    summary = {}
    for arm in ("optirack", "slurm alone"):
        mine = [r for r in rounds if r["arm"] == arm]
        summary[arm] = {k: statistics.median(r[k] for r in mine) for k in
                        ("requeued_s", "started_again_s", "iterating_again_s", "iterations_lost")}
        log(f"{arm}: requeued {summary[arm]['requeued_s']:.2f} s after the server's death, iterating again at "
            f"{summary[arm]['iterating_again_s']:.2f} s, {summary[arm]['iterations_lost']:g} iterations lost "
            f"(medians of {len(mine)})")
    return {"repeats": repeats, "slurmd_timeout_s": 30, "cred_expire_s": CRED_EXPIRE_S, "rounds": rounds,
            "summary": summary}


SIZES = (1, 2, 1, 3, 1, 2, 4, 1, 2, 1)  # GPUs of the prolog-cost jobs, in turn


def prolog_cost(tb: Testbed, workdir: Path, jobs: int) -> dict:
    tb.client.put("/ocs/circuits", {"circuits": [[str(a), str(b)] for a, b in tb.rack.spec.circuits]})
    start_slurm(tb, hooks=True)
    before = tb.client.get("/slurm/topology")
    answers: list[list[float]] = []  # [asked at, seconds to answer]
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            t = time.time()
            slurm.run("squeue", "--noheader", "--format=%i", check=False)
            answers.append([t, time.time() - t])
            time.sleep(0.1)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    t0 = time.time()
    try:
        ids = [sbatch(workdir, f"--gpus={SIZES[i % len(SIZES)]}", wrap=f"sleep {1 + i % 2}") for i in range(jobs)]
        wait_for(lambda: not (set(ids) & queued()), 900, f"the {jobs} jobs to end", interval=0.5)
        time.sleep(1)  # the last epilog and reload
    finally:
        stop.set()
        asker.join()
    after = tb.client.get("/slurm/topology")
    reloads = [h for h in after["history"] if h["started"] >= t0]
    during = [a[1] for a in answers if any(h["started"] <= a[0] <= h["started"] + h["seconds"] for h in reloads)]
    hooks = {(h["job"], h["kind"]): h for h in slurm.hook_times() if h["job"] in ids}
    prologs = [hooks[(j, "prolog")]["seconds"] for j in ids if (j, "prolog") in hooks]
    events = [e for e in tb.client.get("/events", limit=1000)["events"]
              if e.get("job") in {f"slurm-{j}" for j in ids} and e["requested_at"] >= t0]
    states = slurm.run("sacct", "-X", "-n", "-P", "-o", "State", "-j", ",".join(ids)).stdout.split()
    counts = {k: after[k] - before[k] for k in ("refreshes", "unchanged", "reconfigures", "failed")}
    summary = {"jobs": jobs, "prologs": len(prologs), "prolog_p50_s": percentile(prologs, 50),
               "prolog_p99_s": percentile(prologs, 99), "prolog_max_s": max(prologs),
               "squeue_p50_s": percentile([a[1] for a in answers], 50), "squeue_max_s": max(a[1] for a in answers),
               "squeue_during_reload_p50_s": percentile(during, 50) if during else None,
               "squeue_during_reload_max_s": max(during) if during else None, "squeue_asked": len(answers),
               "squeue_during_reload": len(during), **counts, "most_in_flight": after["most_in_flight"],
               "regroups": len(events), "completed": states.count("COMPLETED"), "makespan_s": time.time() - t0}
    log(f"prolog over {len(prologs)} jobs: p50 {summary['prolog_p50_s']:.3f} s, p99 {summary['prolog_p99_s']:.3f} s, "
        f"max {summary['prolog_max_s']:.3f} s; squeue answered in p50 {summary['squeue_p50_s']:.3f} s, max "
        f"{summary['squeue_max_s']:.3f} s ({len(during)} answers during a reload, max "
        f"{summary['squeue_during_reload_max_s'] or 0:.3f} s); {counts['reconfigures']} reconfigures, "
        f"{counts['unchanged']} circuit changes left the tree as it was, most in flight {after['most_in_flight']}")
    return {"summary": summary, "prologs": [hooks.get((j, "prolog")) for j in ids],
            "reloads": reloads, "squeue": answers, "placed": placements(tb, ids, events), "sizes": list(SIZES)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.slurm_experiment", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=["a"], help="the paper's case (a) through sbatch")
    p.add_argument("--topology-mix", action="store_true", help="circuit changes with and without topology.conf")
    p.add_argument("--failover", action="store_true", help="a node lost under a --requeue job: optirack's notice "
                   "against Slurm alone")
    p.add_argument("--prolog-cost", action="store_true", help="what the prolog adds to each job's start")
    p.add_argument("--jobs", type=int, default=50, help="jobs of --prolog-cost (%(default)s)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=12, help="iterations of the 4-GPU job (default 12, as make demo)")
    p.add_argument("--no-record", action="store_true", help="print only")
    p.add_argument("--keep", metavar="DIR", help="run in this new directory and keep it: the jobs' outputs and "
                   "checkpoints, the controller's log (tb/controller.log)")
    args = p.parse_args(argv)
    if not (args.case or args.topology_mix or args.failover or args.prolog_cost):
        p.error("give --case a, --topology-mix, --failover or --prolog-cost (or several)")
    if args.repeats < 1 or args.jobs < 1:
        p.error("--repeats and --jobs must be 1 or more")
    record = {"versions": versions(), "started": utc_stamp()}
    if args.keep and Path(args.keep).exists():
        p.error(f"--keep {args.keep}: it exists already (name a new directory)")
    with tempfile.TemporaryDirectory(prefix="optirack-slurm-") as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        workdir.chmod(0o755)
        tb = Testbed(load_rack(PAPER), PAPER, workdir / "tb").__enter__()
        try:
            if args.case:
                record["case_a"] = case_a(tb, workdir, args.repeats, args.iterations)
            if args.topology_mix:
                record["topology_mix"] = topology_mix(tb, workdir)
            if args.failover:
                record["failover"] = failover(tb, workdir, args.repeats)
            if args.prolog_cost:
                record["prolog_cost"] = prolog_cost(tb, workdir, args.jobs)
        finally:
            slurm.stop(quiet=True)
            tb.__exit__(None, None, None)
    if not args.no_record:
        commit = record["versions"]["optirack"] or "nogit"
        dirty = "-dirty" if record["versions"]["git_dirty"] else ""
        path = write_new(ROOT / "results" / "slurm" / f"{record['started']}-{commit}{dirty}.json", record)
        log(f"record: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Through Slurm on the emulated paper rack (docs/slurm.md), as root under the rack lock:

- `--case a`: the paper's case (a) submitted with sbatch: the 4-GPU job (one M40 on each server, so across both
  switches) beside the 2-GPU job (the Titan Vs, kept where they are with --comment optirack:fixed); fragmented:
  Slurm without optirack's hooks; regrouped: with them. The 4-GPU job's completion (first iteration's start to
  the last one's end, in rack seconds) and the saving, over repeats.
- `--topology-mix`: the same mix of sbatch jobs (GPUs by count, or one GPU on each of two nodes; held for a few
  seconds), all submitted at once, with the hooks, once with topology.conf (the tree from the live circuits,
  reloaded after each change) and once without a topology plugin: circuit changes and dark-window seconds of each.

Prints the figures and writes a record under results/slurm/ (never overwriting one).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from controller.core.rack import load_rack
from emulation import slurm
from emulation.harness import Testbed, wait_for
from evidence.records import ROOT, utc_stamp, versions, write_new

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
    hook = slurm.Hook(str(BIN / "optirack-slurm-hook"), str(PAPER), tb.controller.url,
                      str(tb.controller.state_dir / "token"), topology=topology) if hooks else None
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
            "circuit_changes": changes, "dark_window_s": dark, "makespan_s": time.time() - t0}


def topology_mix(tb: Testbed, workdir: Path) -> dict:
    runs = []
    for topology in (False, True):
        r = mix_once(tb, workdir, topology)
        log(f"  mix of {r['jobs']} sbatch jobs {'with' if topology else 'without'} topology.conf: "
            f"{r['regroups']} circuit changes of jobs ({r['circuit_changes']} circuits), "
            f"{r['dark_window_s']:.3f} s dark, makespan {r['makespan_s']:.0f} s")
        runs.append(r)
    return {"mix": [[" ".join(args), s] for args, s in MIX], "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.slurm_experiment", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=["a"], help="the paper's case (a) through sbatch")
    p.add_argument("--topology-mix", action="store_true", help="circuit changes with and without topology.conf")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=12, help="iterations of the 4-GPU job (default 12, as make demo)")
    p.add_argument("--no-record", action="store_true", help="print only")
    args = p.parse_args(argv)
    if not args.case and not args.topology_mix:
        p.error("give --case a, --topology-mix, or both")
    record = {"versions": versions(), "started": utc_stamp()}
    with tempfile.TemporaryDirectory(prefix="optirack-slurm-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o755)
        tb = Testbed(load_rack(PAPER), PAPER, workdir / "tb").__enter__()
        try:
            if args.case:
                record["case_a"] = case_a(tb, workdir, args.repeats, args.iterations)
            if args.topology_mix:
                record["topology_mix"] = topology_mix(tb, workdir)
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

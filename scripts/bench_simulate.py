#!/usr/bin/env python3
"""Benchmark: `optirack simulate` at cluster scale, timed end to end (plots included), with its peak memory, three
runs by default, each run's results compared with the first's (the same seed must give the same results).

Default: 16,384 GPUs, 100,000 synthetic jobs, seed 1, the default policies (the bound it is held to: within 10 min
and 2 GB on this 2-core machine). Memory: the peak, sampled every 0.2 s, of the summed resident set (RSS) of the
command and every process it started (its policy workers), and of their summed proportional set (PSS: a page shared
by k processes counts 1/k, so forked workers' shared pages are counted once); the 2 GB bound is checked on the RSS
sum, the larger.
Run it alone on the machine, under the rack lock: `flock /tmp/optirack-rack.lock python scripts/bench_simulate.py`.
Each run's results are kept as a hash in the record, so the runs can be split over several holds of the lock:
`--runs 1 --json R`, then `--runs 1 --add --json R` as often as wanted (the same settings, or it stops), each added
run compared with the record's first.
`--before REV`: also run the simulator of commit REV (its tree, from git archive, in a temporary folder), each of its
runs just before one of this tree's, back to back on the same machine; the record keeps its runs under "before", the
speed-up (its median time over this tree's) and whether every run of both gave the same figures (the same hash).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LIMIT_S, LIMIT_BYTES = 600.0, 2 * 1024**3
ROOT = Path(__file__).resolve().parents[1]


def _tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _memory(pids: list[int]) -> tuple[int, int]:
    """Summed RSS and PSS in bytes (smaps_rollup)."""
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, pss


def run(args, out: Path, tree: Path = ROOT) -> dict:
    """One timed run of `optirack simulate` with the code of `tree` (its folder first on the module path)."""
    cmd = [sys.executable, "-c", "import sys; from controller.cli import main; sys.exit(main(sys.argv[1:]))",
           "simulate", "--gpus", str(args.gpus), "--jobs", str(args.jobs), "--seed", str(args.seed), "--quiet",
           "--out", str(out), *args.extra]
    peak = [0, 0]
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=tree)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            rss, pss = _memory(_tree(proc.pid))
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    seconds = time.monotonic() - t0
    done.set()
    sampler.join()
    if rc:
        raise SystemExit(f"bench_simulate: optirack simulate exited {rc}")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    return {"wall_s": seconds, "peak_rss_bytes": peak[0], "peak_pss_bytes": peak[1], "out_bytes": size,
            "started": started, "load_1min_before": load, "figures_sha256": _digest(figures(out))}


def figures(out: Path) -> dict:
    """What must be the same for the same seed: every policy's summary, less the wall times."""
    record = json.loads((out / "results.json").read_text())
    return {name: {k: v for k, v in p["summary"].items() if k != "wall_s"} | {"cdf": p.get("cdf"),
                                                                             "jobs": p.get("jobs")}
            for name, p in record["policies"].items()}


def _digest(figs: dict) -> str:
    return hashlib.sha256(json.dumps(figs, sort_keys=True).encode()).hexdigest()


def _checkout(rev: str, into: Path) -> str:
    """Commit `rev`'s tree in the folder `into`; its full commit id."""
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                                capture_output=True, text=True).stdout.strip()
        into.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"bench_simulate: --before {rev}: not a commit of {ROOT} ({(e.stderr or b'')!r})") from None
    return commit


def _head() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"


def _spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3, help="runs, each compared with the first (%(default)s)")
    ap.add_argument("--out", type=Path, help="keep the first run's output here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--add", action="store_true",
                    help="add these runs to the record --json names (made with the same settings), compared with its "
                         "first run")
    ap.add_argument("--before", metavar="REV",
                    help="also time commit REV's simulator, each of its runs just before one of this tree's")
    ap.add_argument("extra", nargs="*", help="more options for optirack simulate (after --)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.before and args.add:
        ap.error("--before makes a record of its own: not with --add")
    command = f"optirack simulate --gpus {args.gpus} --jobs {args.jobs} --seed {args.seed} " + " ".join(args.extra)
    runs: list[dict] = []
    if args.add:
        if not args.json or not args.json.is_file():
            ap.error("--add needs --json naming an existing record")
        try:
            before = json.loads(args.json.read_text())
            runs = list(before["runs"])
            old = before["command"]
        except (ValueError, KeyError, TypeError) as e:
            ap.error(f"--add: {args.json} is not a bench_simulate record ({e})")
        if old != command or any("figures_sha256" not in r for r in runs):
            ap.error(f"--add: {args.json} was made by {old!r}, not {command!r}, or holds no results' hashes")
    done = len(runs)
    before: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        first = args.out or Path(tmp) / "run1"
        old_tree = Path(tmp) / "before"
        old_commit = _checkout(args.before, old_tree) if args.before else None
        for i in range(args.runs):
            out = first if i == 0 else Path(tmp) / f"run{i + 1}"
            if old_commit:
                before.append(run(args, Path(tmp) / f"before{i + 1}", old_tree))
                b = before[-1]
                print(f"run {i + 1} of {old_commit[:12]}: {b['wall_s']:.1f} s, peak RSS "
                      f"{b['peak_rss_bytes'] / 2**20:,.0f} MiB (PSS {b['peak_pss_bytes'] / 2**20:,.0f} MiB)",
                      file=sys.stderr)
            runs.append(run(args, out))
            r = runs[-1]
            print(f"run {done + i + 1}: {r['wall_s']:.1f} s, peak RSS {r['peak_rss_bytes'] / 2**20:,.0f} MiB "
                  f"(PSS {r['peak_pss_bytes'] / 2**20:,.0f} MiB), {r['out_bytes'] / 2**20:.1f} MiB written",
                  file=sys.stderr)
        same = all(r["figures_sha256"] == runs[0]["figures_sha256"] for r in runs)
        pngs = sorted(p.name for p in first.glob("*.png"))
        files = sorted(p.name for p in first.iterdir())
    row = {
        "command": command,
        "gpus": args.gpus, "jobs": args.jobs, "seed": args.seed, "runs": runs,
        "wall_s": _spread([r["wall_s"] for r in runs]),
        "peak_rss_bytes": _spread([r["peak_rss_bytes"] for r in runs]),
        "peak_pss_bytes": _spread([r["peak_pss_bytes"] for r in runs]),
        "out_bytes": runs[0]["out_bytes"], "files": files, "plots": pngs,
        "same_results": same if len(runs) > 1 else None, "cpus": os.cpu_count(),
        "within_limits": all(r["wall_s"] <= LIMIT_S and r["peak_rss_bytes"] <= LIMIT_BYTES for r in runs),
    }
    if old_commit:
        row["commit"] = _head()
        row["before"] = {"commit": old_commit, "runs": before, **{k: _spread([r[k] for r in before]) for k in (
            "wall_s", "peak_rss_bytes", "peak_pss_bytes")}}
        row["speedup"] = row["before"]["wall_s"]["median"] / row["wall_s"]["median"]
        row["same_results_as_before"] = all(r["figures_sha256"] == runs[0]["figures_sha256"] for r in before)
    w, m = row["wall_s"], row["peak_rss_bytes"]
    print(f"\n{args.gpus} GPUs, {args.jobs} jobs, seed {args.seed}, {len(runs)} runs: "
          f"{w['min']:.1f} / {w['median']:.1f} / {w['max']:.1f} s (min / median / max) end to end; "
          f"peak RSS {m['min'] / 2**20:,.0f} / {m['median'] / 2**20:,.0f} / {m['max'] / 2**20:,.0f} MiB; "
          f"{row['out_bytes'] / 2**20:.1f} MiB written; plots: {', '.join(pngs) or 'none'}"
          + ("" if row["same_results"] is None else f"; same results every run: {same}")
          + f"; within 10 min and 2 GB: {row['within_limits']}")
    if old_commit:
        b = row["before"]
        print(f"{old_commit[:12]}, just before each: {b['wall_s']['median']:.1f} s median, peak RSS "
              f"{b['peak_rss_bytes']['max'] / 2**20:,.0f} MiB at most; {row['speedup']:.2f}x faster; the same figures "
              f"as before: {row['same_results_as_before']}")
    if args.json:
        args.json.write_text(json.dumps(row, indent=1))
    return 0 if row["same_results"] in (None, True) and row.get("same_results_as_before", True) and (
        pngs or "--no-plots" in args.extra) else 1


if __name__ == "__main__":
    sys.exit(main())

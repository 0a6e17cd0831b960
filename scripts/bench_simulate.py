#!/usr/bin/env python3
"""Benchmark: `optirack simulate` at cluster scale, timed end to end (plots included), twice, with the
second run's results compared to the first's (the same seed must give the same results).

Default: 4,096 GPUs, 2,000 synthetic jobs, seed 7, every policy (the README's large run).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(args, out: Path) -> float:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from controller.cli import main; sys.exit(main(sys.argv[1:]))",
        "simulate",
        "--gpus",
        str(args.gpus),
        "--jobs",
        str(args.jobs),
        "--seed",
        str(args.seed),
        "--out",
        str(out),
        *args.extra,
    ]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    return time.monotonic() - t0


def jobs_of(out: Path) -> dict:
    record = json.loads((out / "results.json").read_text())
    return {name: p["jobs"] for name, p in record["policies"].items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, help="keep the first run's output here (default: a temporary folder)")
    ap.add_argument("--once", action="store_true", help="one run, no determinism check")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("extra", nargs="*", help="more options for optirack simulate (after --)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        first = args.out or Path(tmp) / "first"
        seconds = [run(args, first)]
        pngs = sorted(p.name for p in first.glob("*.png"))
        same = None
        if not args.once:
            seconds.append(run(args, Path(tmp) / "second"))
            same = jobs_of(first) == jobs_of(Path(tmp) / "second")
    row = {
        "gpus": args.gpus,
        "jobs": args.jobs,
        "seed": args.seed,
        "wall_s": seconds,
        "plots": pngs,
        "same_results": same,
    }
    print(
        f"\n{args.gpus} GPUs, {args.jobs} jobs, seed {args.seed}: "
        + ", ".join(f"{s:.1f} s" for s in seconds)
        + f" end to end; plots: {', '.join(pngs) or 'none'}"
        + ("" if same is None else f"; same results twice: {same}")
    )
    if args.json:
        args.json.write_text(json.dumps(row, indent=1))
    return 0 if same in (None, True) and pngs else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: planning time of the regroup policy on large generated racks (no devices needed).

For each rack size, half the GPUs are first given to running jobs (grouped, so their circuits
are protected); then new jobs of several sizes are planned against that rack. Prints the median
planning time, with min and max, per job size.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from controller.core.circuits import CircuitMap
from controller.core.placement import pick_gpus, plan_regroup
from controller.core.rackgen import generate

try:
    from scripts.stats import add_json_option, show, spread, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, show, spread, write_json

RACKS = {1024: dict(switches=32, ocs=4, gpus_per_server=8), 4096: dict(switches=64, ocs=8, gpus_per_server=8)}


def occupy(rack, rng):
    """Fill half the rack with grouped jobs of 8 GPUs; return circuits, busy GPUs, protected ports."""
    circuits, busy, protected = CircuitMap.initial(rack), set(), set()
    while len(busy) < len(rack.gpus) // 2:
        job = pick_gpus(rack, circuits, busy, 8, "regroup")
        p = plan_regroup(rack, circuits, job, protected)
        circuits = p.target
        busy |= set(job)
        protected |= {rack.gpu_port(g) for g in job}
    return circuits, busy, protected


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="8,32,128")
    add_json_option(ap)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    results = []
    print(f"planning time, median (min–max) over {args.rounds} jobs, in ms")
    print(f"{'GPUs':>6} {'switches':>8} {'OCS':>4} {'job':>5} {'planning':>24} {'changes':>8}")
    for n, kw in RACKS.items():
        t0 = time.perf_counter()
        rack = generate(n, spare=1.5, **kw)
        circuits, busy, protected = occupy(rack, rng)
        setup = time.perf_counter() - t0
        for size in (int(s) for s in args.sizes.split(",")):
            times, changes = [], []
            for _ in range(args.rounds):
                job = rng.sample([g for g in rack.gpus if g not in busy], size)
                t = time.perf_counter()
                p = plan_regroup(rack, circuits, job, protected)
                times.append(time.perf_counter() - t)
                changes.append(p.changes)
            ms = spread(times, 1000)
            results.append({"gpus": n, **kw, "job": size, "planning_ms": ms, "changes": spread(changes)})
            print(f"{n:6d} {kw['switches']:8d} {kw['ocs']:4d} {size:5d} {show(ms):>24s} {statistics.median(changes):8.0f}",
                  flush=True)
        print(f"       (rack {n}: generated and half filled in {setup:.1f} s)")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: planning time of the regroup policy on large generated racks (no devices needed).

For each rack size, half the GPUs are first given to running jobs (grouped, so their circuits
are protected); then new jobs of several sizes are planned against that rack. Prints the median
and worst planning time per job size.
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
    args = ap.parse_args(argv)
    rng = random.Random(0)
    print(f"{'GPUs':>6} {'switches':>8} {'OCS':>4} {'job':>5} {'median ms':>10} {'worst ms':>9} {'changes':>8}")
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
            print(f"{n:6d} {kw['switches']:8d} {kw['ocs']:4d} {size:5d} {1000 * statistics.median(times):10.1f} "
                  f"{1000 * max(times):9.1f} {statistics.median(changes):8.0f}", flush=True)
        print(f"       (rack {n}: generated and half filled in {setup:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: planning time of a job's placement on large generated racks (no devices needed).

Each rack has two GPU models (V100 and A100 on alternate servers) and is first half filled with
jobs of 8 GPUs. Then, per job size, each round plans a new job with the regroup policy
(`controller.core.placement.plan`), commits it, and ends random running jobs until the rack is
half full again, so every round plans against a different, churned rack. Two kinds of job:
`count` asks for N GPUs (the planner chooses them by model and switch, and their circuits);
`named` names N random free GPUs, scattered over the rack, so nearly all of them must move.
Prints min / median / max planning time per rack size, kind and job size.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from controller.core.circuits import CircuitMap
from controller.core.occupancy import Occupancy
from controller.core.placement import NoRoomNow, Request, plan
from controller.core.rackgen import generate

try:
    from scripts.stats import add_json_option, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, write_json

RACKS = {1024: dict(switches=32, ocs=4, gpus_per_server=8), 4096: dict(switches=64, ocs=8, gpus_per_server=8),
         16384: dict(switches=128, ocs=16, gpus_per_server=8)}
MODELS = ("V100", "A100")


class Churn:
    """A rack kept half full: jobs are committed into the occupancy and random ones end."""

    def __init__(self, occ: Occupancy, rng: random.Random):
        self.occ, self.rng, self.ids = occ, rng, 0
        self.running: list[str] = []

    def commit(self, p) -> None:
        self.ids += 1
        job = f"job-{self.ids}"
        self.occ.commit(job, p)
        self.running.append(job)

    def busy(self) -> int:
        return len(self.occ.ix.gpus) - sum(self.occ.free_model)

    def settle(self) -> None:
        """End random jobs until at most half the GPUs are busy."""
        while self.busy() > len(self.occ.ix.gpus) // 2:
            job = self.running.pop(self.rng.randrange(len(self.running)))
            self.occ.release(job)

    def fill(self, size: int = 8) -> None:
        while self.busy() + size <= len(self.occ.ix.gpus) // 2:
            self.commit(plan(self.occ, Request(size)))


def _request(occ: Occupancy, kind: str, size: int, rng: random.Random) -> Request:
    if kind == "count":
        return Request(size)
    free = [g for gi, g in enumerate(occ.ix.gpus) if occ.holder[gi] is None]
    return Request(tuple(rng.sample(free, size)))


def bench_rack(gpus: int, kinds: list[str], sizes: list[int], rounds: int, rng: random.Random) -> list[dict]:
    kw = RACKS[gpus]
    t0 = time.perf_counter()
    rack = generate(gpus, spare=1.5, models=MODELS, **kw)
    occ = Occupancy(rack, CircuitMap.initial(rack))
    churn = Churn(occ, rng)
    churn.fill()
    print(f"  rack of {gpus} GPUs ({kw['switches']} switches, {kw['ocs']} OCS, {' + '.join(MODELS)}): generated and "
          f"half filled in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for kind, size in ((k, s) for k in kinds for s in sizes):
        times, changes, switches = [], [], []
        for _ in range(rounds):
            req = _request(occ, kind, size, rng)
            t = time.perf_counter()
            try:
                p = plan(occ, req)
            except NoRoomNow:
                p = None
            times.append(1000 * (time.perf_counter() - t))
            if p is not None:
                changes.append(p.changes)
                switches.append(len(p.switches))
                churn.commit(p)
            churn.settle()
        rows.append({"gpus": gpus, "job_gpus": size, "kind": kind, "min_ms": round(min(times), 3),
                     "median_ms": round(statistics.median(times), 3), "max_ms": round(max(times), 3),
                     "rounds": rounds, "switches": kw["switches"], "ocs": kw["ocs"],
                     "median_changes": statistics.median(changes) if changes else None,
                     "median_job_switches": statistics.median(switches) if switches else None})
        r = rows[-1]
        print(f"{gpus:7d} {kind:6s} {size:5d} {r['min_ms']:9.2f} {r['median_ms']:9.2f} {r['max_ms']:9.2f} "
              f"{r['median_job_switches'] or 0:9.0f} {r['median_changes'] or 0:8.0f}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30, help="jobs planned per row (default %(default)s)")
    ap.add_argument("--sizes", default="8,32,128", help="job sizes in GPUs (default %(default)s)")
    ap.add_argument("--kinds", default="count,named", help="count, named, or both (default %(default)s)")
    ap.add_argument("--racks", default="1024,4096,16384",
                    help=f"rack sizes in GPUs, of {', '.join(map(str, RACKS))} (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    add_json_option(ap)
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        racks = [int(s) for s in args.racks.split(",")]
    except ValueError:
        ap.error("--sizes and --racks take comma-separated integers")
    kinds = args.kinds.split(",")
    if not kinds or set(kinds) - {"count", "named"}:
        ap.error("--kinds: count, named, or count,named")
    unknown = [r for r in racks if r not in RACKS]
    if unknown:
        ap.error(f"--racks: no generated rack of {unknown[0]} GPUs (choose from {', '.join(map(str, RACKS))})")
    rng = random.Random(args.seed)
    print("planning time of one job (GPU choice + circuits), half-full rack, regroup policy")
    print(
        f"{'GPUs':>7s} {'kind':6s} {'job':>5s} {'min ms':>9s} {'median ms':>9s} {'max ms':>9s} "
        f"{'switches':>9s} {'changes':>8s}"
    )
    rows = []
    for gpus in racks:
        rows += bench_rack(gpus, kinds, sizes, args.rounds, rng)
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: what one save of the controller's state costs with 10 and with 10,000 recorded jobs.

The save is the controller's own (the job book's save of a job that changed: the circuit map, that
job and the active jobs, one SQLite transaction, fsync'd). The finished jobs are written first
and are not timed. Prints min/median/max per size and fails (exit 1) if the median at the
largest size is more than twice the median at the smallest.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from controller.apps.context import Optirack
from controller.core.jobs import Job
from controller.core.rack import load_rack

try:
    from scripts.stats import add_json_option, spread, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, spread, write_json

ROOT = Path(__file__).resolve().parent.parent


class NoContainers:
    """The benchmark starts no job: a driver that is never asked for anything."""

    def containers(self, server, job=None):
        return []


def finished_job(i: int, now: float) -> Job:
    reports = {
        g: [
            {
                "event": "iteration",
                "iteration": k,
                "t_start": now + k,
                "t_end": now + k + 1,
                "compute_s": 0.6,
                "comm_s": 0.4,
                "iter_s": 1.0,
                "gpu_util": 0.6,
                "bytes": 1,
            }
            for k in range(5)
        ]
        for g in ("gpu1", "gpu2")
    }
    return Job(
        id=f"job-{i}",
        request={"gpus": ["gpu1", "gpu2"], "policy": "fixed", "workload": {"iterations": 5}},
        state="done",
        gpus=["gpu1", "gpu2"],
        switches=["as1"],
        created_at=now,
        started_at=now,
        ended_at=now + 5,
        reports=reports,
        exit_codes={"gpu1": 0, "gpu2": 0},
    )


def measure(jobs: int, saves: int, rack) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="optirack-bench-store-") as tmp:
        ctx = Optirack(rack=rack, state_dir=Path(tmp), containers=NoContainers())
        placement = ctx.jobs  # the job service the wiring built (its threads not started: only saves are timed)
        now = time.time()
        history = [finished_job(i, now) for i in range(1, jobs + 1)]
        ctx.store.save(jobs=[j.to_state() for j in history])  # the recorded history (not timed)
        placement.jobs.update((j.id, j) for j in history)
        placement.jobs.saved(history)  # they are on disk already, as after a restart
        live = Job(
            id=f"job-{jobs + 1}",
            request={"gpus": ["gpu3"], "policy": "fixed", "workload": {}},
            state="running",
            gpus=["gpu3"],
            created_at=now,
        )
        placement.jobs[live.id] = live
        times = []
        for k in range(saves):
            live.note = f"change {k}"
            t0 = time.perf_counter()
            placement.book.save(live)
            times.append(time.perf_counter() - t0)
        ctx.store.close()
        return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 10_000], help="recorded jobs (default %(default)s)")
    p.add_argument("--saves", type=int, default=200, help="saves timed per size (default %(default)s)")
    p.add_argument("--topo", default=str(ROOT / "topologies" / "paper-testbed.yaml"))
    add_json_option(p)
    args = p.parse_args(argv)
    rack = load_rack(args.topo)
    medians, rows = {}, []
    print(f"one save of the controller's state (SQLite, WAL, synchronous=FULL), {args.saves} saves per size")
    print(f"{'recorded jobs':>14s} {'min ms':>8s} {'median ms':>10s} {'max ms':>8s}")
    for n in args.sizes:
        print(f"{n:>14,d} ...", end="\r", flush=True)
        t = measure(n, args.saves, rack)
        medians[n] = statistics.median(t)
        rows.append({"recorded_jobs": n, "save_ms": spread(t, scale=1e3, digits=4)})
        print(f"{n:>14,d} {min(t) * 1e3:8.3f} {medians[n] * 1e3:10.3f} {max(t) * 1e3:8.3f}")
    small, large = min(medians), max(medians)
    ratio = medians[large] / medians[small]
    verdict = "OK" if ratio <= 2.0 else "FAIL"
    print(f"median at {large:,d} / median at {small:,d} jobs: {ratio:.2f} (at most 2 wanted): {verdict}")
    write_json(args.json, {"saves": args.saves, "sizes": rows, "ratio_largest_to_smallest": round(ratio, 3)})
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())

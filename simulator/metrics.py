"""Figures of a run: JCT distribution, queueing delay, GPU utilization over time, reconfiguration cost."""
from __future__ import annotations

import statistics

from simulator.engine import JobResult, RunResult

BINS = 200


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values) if values else float("nan"), "median": quantile(values, 0.5),
            "p90": quantile(values, 0.9), "p99": quantile(values, 0.99), "max": max(values, default=float("nan"))}


def series(pieces: list[tuple[float, float, float]], end: float, bins: int = BINS) -> list[float]:
    """Average level per bin of [0, end) of pieces (from, to, amount spread evenly over [from, to))."""
    width = end / bins if end > 0 else 1.0
    out = [0.0] * bins
    for t0, t1, amount in pieces:
        if t1 <= t0:
            continue
        rate = amount / (t1 - t0)
        first, last = int(t0 / width), min(int(t1 / width), bins - 1)
        for b in range(max(first, 0), last + 1):
            overlap = min(t1, (b + 1) * width) - max(t0, b * width)
            if overlap > 0:
                out[b] += rate * overlap / width
    return out


def utilization(run: RunResult, gpus: int, bins: int = BINS) -> dict[str, list[float]]:
    """Fractions of the cluster's GPUs held by jobs, and computing, per time bin."""
    end = max((j.end_s for j in run.jobs), default=0.0)
    held = series([(a, b, n * (b - a)) for a, b, n in run.held], end, bins)
    busy = series(run.busy, end, bins)
    width = end / bins if end else 1.0
    return {"t_s": [width * (b + 0.5) for b in range(bins)], "held": [h / gpus for h in held],
            "computing": [x / gpus for x in busy]}


def summary(run: RunResult, gpus: int, wall_s: float) -> dict:
    jobs: list[JobResult] = [j for j in run.jobs if not j.failed]
    end = max((j.end_s for j in jobs), default=0.0)
    held = sum((b - a) * n for a, b, n in run.held)
    busy = sum(x for _, _, x in run.busy)
    return {
        "jobs": len(jobs), "jct_s": spread([j.jct_s for j in jobs]), "queue_s": spread([j.queue_s for j in jobs]),
        "makespan_s": end, "gpu_held": held / (gpus * end) if end else 0.0,
        "gpu_computing": busy / (gpus * end) if end else 0.0,
        "reconfigurations": run.reconfigurations, "circuits_changed": run.circuits_changed, "dark_s": run.dark_s,
        "stalled_gpu_s": sum(j.stall_s * j.gpus for j in jobs), "moves": sum(j.moves for j in jobs),
        "spread_jobs": sum(j.switches > 1 for j in jobs), "shared_jobs": sum(j.shared for j in jobs),
        "shifted_jobs": sum(j.shift_s > 0 for j in jobs), "failed_jobs": sum(bool(j.failed) for j in run.jobs),
        "interference": run.stats, "wall_s": wall_s,
    }


def job_rows(run: RunResult, placements: bool) -> list[dict]:
    rows = []
    for j in run.jobs:
        row = {"id": j.id, "gpus": j.gpus, "model": j.model, "iterations": j.iterations, "arrival_s": j.arrival_s,
               "placed_s": j.placed_s, "start_s": j.start_s, "end_s": j.end_s, "jct_s": j.jct_s, "queue_s": j.queue_s,
               "switches": j.switches, "shared": j.shared, "shift_s": j.shift_s, "moves": j.moves,
               "stall_s": j.stall_s, "mean_iteration_s": j.mean_iteration_s, "alone_iteration_s": j.alone_iteration_s}
        if j.label:
            row["label"] = j.label
        if j.failed:
            row["failed"] = j.failed
        if placements:
            row["placement"] = list(j.placement)
        rows.append(row)
    return rows


def timeshift_gain(unshifted: RunResult, shifted: RunResult) -> dict:
    """Jobs that shared a link when unshifted, placed alike in both runs: their completion times."""
    by_id = {j.id: j for j in shifted.jobs}
    same, differ = [], 0
    for j in unshifted.jobs:
        k = by_id[j.id]
        if not j.shared or j.failed or k.failed:
            continue
        if j.placement == k.placement:
            same.append((j, k))
        else:
            differ += 1
    if not same:
        return {"jobs": 0, "placed_differently": differ}
    before = sum(j.jct_s for j, _ in same)
    after = sum(k.jct_s for _, k in same)
    return {"jobs": len(same), "placed_differently": differ, "jct_unshifted_s": before / len(same),
            "jct_shifted_s": after / len(same), "saved": 1 - after / before,
            "iteration_unshifted_s": statistics.fmean(j.mean_iteration_s for j, _ in same),
            "iteration_shifted_s": statistics.fmean(k.mean_iteration_s for _, k in same),
            "faster": sum(k.jct_s < j.jct_s - 1e-9 for j, k in same), "ids": [j.id for j, _ in same]}

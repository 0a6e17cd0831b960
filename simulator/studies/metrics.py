"""Figures of a run: JCT distribution, queueing delay, GPU utilization over time, reconfiguration cost."""
from __future__ import annotations

import statistics

import numpy as np

from simulator.model.busy import Busy, Rows
from simulator.model.engine import JobResult, RunResult

BINS = 200


def quantile(values: list[float], q: float) -> float:
    return _quantile(sorted(values), q)


def _quantile(s: list[float], q: float) -> float:
    """`quantile` of values already sorted (`s`)."""
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(values: list[float]) -> dict[str, float]:
    s = sorted(values)  # once for every quantile
    return {"mean": statistics.fmean(values) if values else float("nan"), "median": _quantile(s, 0.5),
            "p50": _quantile(s, 0.5), "p90": _quantile(s, 0.9), "p95": _quantile(s, 0.95),
            "p99": _quantile(s, 0.99), "max": max(values, default=float("nan"))}


SIZE_CLASSES = ((1, 1), (2, 8), (9, 32), (33, 128), (129, 10**9))  # GPUs: one GPU, one server, ...
WARMUP = 0.1  # of the arrival span, left out of the steady-state window


def size_class(gpus: int) -> str:
    lo, hi = next(c for c in SIZE_CLASSES if c[0] <= gpus <= c[1])
    return str(lo) if lo == hi else f"{lo}-{hi}" if hi < 10**9 else f">{lo - 1}"


def alone_s(j: JobResult) -> float:
    """The job's run time alone: its iterations at its iteration time alone where it was first
    placed (no queueing, no dark window, no other traffic); a replayed job's recorded duration. A job stopped early
    (--case's job beside, stopped when the job of concern ends) counts the iterations it did, so that its slowdown,
    like every job's, is at least 1 (less only by the rounding of a partial iteration)."""
    if j.alone_run_s:
        return j.alone_run_s
    return (j.done if j.stopped else j.iterations) * j.alone_iteration_s


def slowdown(j: JobResult) -> float:
    """Completion time (arrival to end) over the time alone: 1 for a job that never waited or shared."""
    alone = alone_s(j)
    return j.jct_s / alone if alone > 0 else float("nan")


def steady_window(run: RunResult) -> tuple[float, float]:
    """From WARMUP of the arrival span after the first arrival to the last arrival: the cluster's
    load is then the trace's, neither filling up nor draining."""
    arrivals = [j.arrival_s for j in run.jobs]
    if not arrivals:
        return 0.0, 0.0
    first, last = min(arrivals), max(arrivals)
    return first + WARMUP * (last - first), last


def _columns(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of three numbers (a run's `busy` or `held`) as three float arrays: a Busy's or Rows' typed arrays read as
    they are, a list's tuples copied."""
    if isinstance(rows, Busy):
        columns = (rows.t0, rows.t1, rows.amount)
    elif isinstance(rows, Rows):
        columns = rows.columns
    else:
        rows = list(rows)
        columns = tuple([row[i] for row in rows] for i in range(3))
    return tuple(np.asarray(c, dtype=float) for c in columns)  # type: ignore[return-value]


def _held(run: RunResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The run's GPUs held as pieces (from, to, GPU-seconds: GPUs x (to - from))."""
    a, b, n = _columns(run.held)
    return a, b, n * (b - a)


def _sum(x: np.ndarray) -> float:
    """0.0 + x[0] + x[1] + ... in that order, as a loop (or Python's sum) adds them: the same float (np.sum adds them
    pairwise, which rounds otherwise)."""
    return float(np.cumsum(np.concatenate(([0.0], x)))[-1])


def _within(pieces, t0: float, t1: float) -> float:
    """Amount of pieces (from, to, amount spread evenly; three arrays or rows) that falls in [t0, t1)."""
    a, b, amount = pieces if isinstance(pieces, tuple) else _columns(pieces)
    overlap = np.minimum(b, t1) - np.maximum(a, t0)
    ok = (b > a) & (overlap > 0)
    return _sum(amount[ok] * overlap[ok] / (b[ok] - a[ok]))


def steady_utilization(run: RunResult, gpus: int) -> dict:
    t0, t1 = steady_window(run)
    if t1 <= t0:
        return {"from_s": t0, "to_s": t1, "held": float("nan"), "computing": float("nan"),
                "window": "none: all jobs arrive at once"}
    held = _within(_held(run), t0, t1)
    busy = _within(run.busy, t0, t1)
    return {"from_s": t0, "to_s": t1, "held": held / (gpus * (t1 - t0)), "computing": busy / (gpus * (t1 - t0)),
            "window": f"from {100 * WARMUP:g} % into the arrivals to the last arrival (warm-up and drain left out)"}


def _dist(jobs: list[JobResult]) -> dict:
    return {"jobs": len(jobs), "jct_s": spread([j.jct_s for j in jobs]),
            "slowdown": spread([slowdown(j) for j in jobs]), "queue_s": spread([j.queue_s for j in jobs])}


def by_size(jobs: list[JobResult]) -> dict[str, dict]:
    out = {}
    for lo, hi in SIZE_CLASSES:
        members = [j for j in jobs if lo <= j.gpus <= hi]
        if members:
            out[size_class(lo)] = _dist(members)
    return out


def quantiles(values: list[float], points: int) -> list[float]:
    """`points` + 1 values at q = 0, 1/points, ..., 1 of `values` (a CDF drawn from a few hundred numbers)."""
    values = sorted(values)
    if not values:
        return []
    return [values[min(len(values) - 1, round(i * (len(values) - 1) / points))] for i in range(points + 1)]


def fragmentation(run: RunResult, switch_ports: int) -> dict:
    """Over time: the largest job one switch could take without rewiring (its free GPUs), and all free GPUs."""
    if not run.frag:
        return {}
    t = [x for x, _, _ in run.frag]
    largest = [y for _, y, _ in run.frag]
    free = [z for _, _, z in run.frag]
    # time-weighted mean of the share of what one switch could hold (its downlinks, or all free GPUs
    # when fewer) that the best switch holds free now
    share, weight = 0.0, 0.0
    for i in range(len(t) - 1):
        dt = t[i + 1] - t[i]
        want = min(free[i], switch_ports)
        if dt > 0 and want > 0:
            share += dt * largest[i] / want
            weight += dt
    mean_largest = sum((t[i + 1] - t[i]) * largest[i] for i in range(len(t) - 1)) / (t[-1] - t[0]) \
        if t[-1] > t[0] else float("nan")
    step = max(1, len(t) // 1000)  # the series as recorded: at most about a thousand points (the means use all)
    return {"t_s": t[::step], "largest_one_switch": largest[::step], "free": free[::step],
            "mean_largest": mean_largest, "mean_reachable": share / weight if weight else float("nan")}


def percent_change(value: float, base: float) -> float:
    return 100 * (value - base) / base if base and base == base and value == value else float("nan")


COMPARED = (("jct_s", "mean"), ("jct_s", "p95"), ("jct_s", "p99"), ("slowdown", "mean"), ("slowdown", "p95"),
            ("queue_s", "mean"), ("makespan_s", None), ("steady", "held"), ("steady", "computing"))


def pick(summary: dict, key: str, sub: str | None) -> float:
    return summary[key] if sub is None else summary[key][sub]


def against(summary: dict, base: dict) -> dict[str, float]:
    """Percent change of each COMPARED figure against the baseline policy's (negative: lower)."""
    return {f"{k}.{sub}" if sub else k: percent_change(pick(summary, k, sub), pick(base, k, sub))
            for k, sub in COMPARED}


def why_equal(a: RunResult, b: RunResult) -> str | None:
    """When two runs gave every job the same completion time: the reason, from what the runs did."""
    ja, jb = {j.id: j.jct_s for j in a.jobs}, {j.id: j.jct_s for j in b.jobs}
    if any(abs(ja[k] - jb[k]) > 1e-9 * max(1.0, abs(ja[k])) for k in ja):
        return None
    reasons = []
    for run in (a, b):
        p = run.policy
        if p.placement == "regroup" and not run.circuits_changed:
            spread = sum(j.switches > 1 for j in run.jobs)
            reasons.append(f"{p.name} changed no circuit (" + (
                "every job fit under one switch as cabled" if not spread else
                f"{spread} of {len(run.jobs)} jobs stayed spread over switches: no circuit change put one under a "
                "single switch") + ")")
        if p.defrag_s and not any(j.moves for j in run.jobs):
            reasons.append(f"{p.name} moved no job (no running job was spread over switches at a round)")
        if p.timeshift and not any(j.shift_s for j in run.jobs):
            shared = sum(j.shared for j in run.jobs)
            reasons.append(f"{p.name} shifted no job" + (f" ({shared} jobs shared a link, but shares are held, "
                           "so interleaving gains nothing, or no shift helped)" if shared else ""))
    if a.policy.placement != b.policy.placement and not any(j.switches > 1 for j in a.jobs + b.jobs):
        reasons.append("no job spanned switches under either, so regrouping had nothing to join")
    if not any(j.shared for j in a.jobs + b.jobs):
        reasons.append("no link was shared by two rings")
    return "; ".join(dict.fromkeys(reasons)) or "the policies made the same decisions for every job"


T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13, 2.12, 2.11, 2.10,
       2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04)  # Student's t, two-sided 95 %, df 1..30


def interval(values: list[float]) -> dict[str, float]:
    """Mean and the half-width of its 95 % confidence interval (Student's t) over seeds."""
    values = [v for v in values if v == v]
    if not values:
        return {"mean": float("nan"), "ci95": float("nan"), "n": 0}
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci95": float("nan"), "n": 1}
    t = T95[len(values) - 2] if len(values) - 1 <= len(T95) else 1.96
    return {"mean": mean, "ci95": t * statistics.stdev(values) / len(values) ** 0.5, "n": len(values)}


def series(pieces, end: float, bins: int = BINS) -> list[float]:
    """Average level per bin of [0, end) of pieces (from, to, amount spread evenly over [from, to); three arrays or
    rows): each piece's share of each bin it overlaps, rate x overlap / width, added to the bin piece after piece (a
    bin's sum in the pieces' order, as a loop over them adds it)."""
    width = end / bins if end > 0 else 1.0
    t0, t1, amount = pieces if isinstance(pieces, tuple) else _columns(pieces)
    moving = t1 > t0
    t0, t1, amount = t0[moving], t1[moving], amount[moving]
    rate = amount / (t1 - t0)
    first = np.maximum(np.trunc(t0 / width), 0.0)  # int() truncates
    count = np.maximum(np.minimum(np.trunc(t1 / width), bins - 1) - first + 1, 0).astype(np.int64)
    piece = np.repeat(np.arange(len(t0)), count)  # a row per piece and bin it spans, piece after piece
    b = first[piece] + (np.arange(len(piece)) - np.repeat(np.cumsum(count) - count, count))
    overlap = np.minimum(t1[piece], (b + 1) * width) - np.maximum(t0[piece], b * width)
    ok = overlap > 0
    return np.bincount(b[ok].astype(np.int64), weights=rate[piece[ok]] * overlap[ok] / width, minlength=bins).tolist()


def utilization(run: RunResult, gpus: int, bins: int = BINS) -> dict[str, list[float]]:
    """Fractions of the cluster's GPUs held by jobs, and computing, per time bin."""
    end = max((j.end_s for j in run.jobs), default=0.0)
    held = series(_held(run), end, bins)
    busy = series(run.busy, end, bins)
    width = end / bins if end else 1.0
    return {"t_s": [width * (b + 0.5) for b in range(bins)], "held": [h / gpus for h in held],
            "computing": [x / gpus for x in busy]}


def summary(run: RunResult, gpus: int, wall_s: float) -> dict:
    jobs: list[JobResult] = [j for j in run.jobs if not j.failed]
    end = max((j.end_s for j in jobs), default=0.0)
    held = _sum(_held(run)[2])
    busy = _sum(_columns(run.busy)[2])
    return {
        "jobs": len(jobs), "jct_s": spread([j.jct_s for j in jobs]), "queue_s": spread([j.queue_s for j in jobs]),
        "slowdown": spread([slowdown(j) for j in jobs]), "steady": steady_utilization(run, gpus),
        "by_size": by_size(jobs), "makespan_s": end, "gpu_held": held / (gpus * end) if end else 0.0,
        "gpu_computing": busy / (gpus * end) if end else 0.0,
        "reconfigurations": run.reconfigurations, "circuits_changed": run.circuits_changed, "dark_s": run.dark_s,
        "stalled_gpu_s": sum(j.stall_s * j.gpus for j in jobs), "moves": sum(j.moves for j in jobs),
        "spread_jobs": sum(j.switches > 1 for j in jobs), "shared_jobs": sum(j.shared for j in jobs),
        "shifted_jobs": sum(j.shift_s > 0 for j in jobs), "failed_jobs": sum(bool(j.failed) for j in run.jobs),
        "interference": run.stats, "wall_s": wall_s,
        "preemptions": sum(j.preemptions for j in jobs), "failures": run.failures,
        "interruptions": sum(j.interruptions for j in run.jobs), "redone_iterations": sum(j.redone for j in run.jobs),
        "lost_gpu_s": run.lost_gpu_s, "restart_gpu_s": run.restart_gpu_s,
        "goodput": 1 - (run.lost_gpu_s + run.restart_gpu_s) / held if held else float("nan"),
    }


def job_rows(run: RunResult, placements: bool) -> list[dict]:
    rows = []
    for j in run.jobs:
        row = {"id": j.id, "gpus": j.gpus, "model": j.model, "iterations": j.iterations, "arrival_s": j.arrival_s,
               "placed_s": j.placed_s, "start_s": j.start_s, "end_s": j.end_s, "jct_s": j.jct_s, "queue_s": j.queue_s,
               "switches": j.switches, "shared": j.shared, "shift_s": j.shift_s, "moves": j.moves,
               "stall_s": j.stall_s, "mean_iteration_s": j.mean_iteration_s, "alone_iteration_s": j.alone_iteration_s,
               "slowdown": slowdown(j)}
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
    shifted_jobs = [k for _, k in same]
    return {"shifted": sum(k.shift_s > 0 for k in shifted_jobs),  # why it saved nothing, where it did not
            "fit": sum(k.score_before >= 1 - 1e-9 for k in shifted_jobs),
            "first": sum(k.score_before == k.score_after == 0 for k in shifted_jobs),
            "no_better": sum(0 < k.score_before < 1 - 1e-9 and k.score_after <= k.score_before + 1e-9
                             for k in shifted_jobs),
            "jobs": len(same), "placed_differently": differ, "jct_unshifted_s": before / len(same),
            "jct_shifted_s": after / len(same), "saved": 1 - after / before,
            "iteration_unshifted_s": statistics.fmean(j.mean_iteration_s for j, _ in same),
            "iteration_shifted_s": statistics.fmean(k.mean_iteration_s for _, k in same),
            "faster": sum(k.jct_s < j.jct_s - 1e-9 for j, k in same), "ids": [j.id for j, _ in same]}

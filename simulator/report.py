"""What `optirack simulate` writes: results.json, summary.md and jobs.csv (plots: simulator/plots.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from simulator import metrics
from simulator.study import Study


def _s(x: float) -> str:
    if x != x:  # nan
        return "-"
    return f"{x:,.0f} s" if abs(x) >= 100 else f"{x:.1f} s" if abs(x) >= 1 else f"{1000 * x:.1f} ms"


def build(study: Study, meta: dict) -> dict:
    gpus = len(study.rack.gpus)
    placements = len(study.jobs) <= 500
    record = {**meta, "policies": {}}
    for name, run in study.runs.items():
        record["policies"][name] = {
            "label": run.policy.label,
            "summary": metrics.summary(run, gpus, study.wall_s[name]),
            "utilization": metrics.utilization(run, gpus),
            "jobs": metrics.job_rows(run, placements),
        }
    if "regroup" in study.runs and "timeshift" in study.runs:
        record["timeshift"] = metrics.timeshift_gain(study.runs["regroup"], study.runs["timeshift"])
    return record


def table(record: dict) -> str:
    rows = [
        "| policy | JCT mean | JCT median | JCT p90 | queueing mean | makespan | GPUs held | GPUs computing "
        "| jobs spread / sharing a link | circuits changed | dark time | sim wall |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in record["policies"].values():
        s = p["summary"]
        rows.append(
            f"| {p['label']} | {_s(s['jct_s']['mean'])} | {_s(s['jct_s']['median'])} | {_s(s['jct_s']['p90'])} "
            f"| {_s(s['queue_s']['mean'])} | {_s(s['makespan_s'])} | {100 * s['gpu_held']:.1f} % "
            f"| {100 * s['gpu_computing']:.1f} % | {s['spread_jobs']} / {s['shared_jobs']} | {s['circuits_changed']:,} "
            f"| {_s(s['dark_s'])} | {s['wall_s']:.1f} s |"
        )
    return "\n".join(rows)


def timeshift_text(ts: dict) -> str:
    if not ts.get("jobs"):
        return (
            "Time shifting: no job shared a link under regroup with the same placement in both runs, so there "
            "was nothing to interleave."
        )
    return (
        f"Time shifting: {ts['jobs']} jobs shared an uplink under regroup and were placed alike with time "
        f"shifting; their mean completion time went from {_s(ts['jct_unshifted_s'])} to {_s(ts['jct_shifted_s'])} "
        f"(**{100 * ts['saved']:.1f} % sooner**; mean iteration {_s(ts['iteration_unshifted_s'])} → "
        f"{_s(ts['iteration_shifted_s'])}; {ts['faster']} of {ts['jobs']} finished sooner)"
        + (
            f"; {ts['placed_differently']} more were placed differently and are left out."
            if ts["placed_differently"]
            else "."
        )
    )


def markdown(record: dict, extra: str = "") -> str:
    w = record["workload"]
    lines = [
        f"# optirack simulate: {record['rack']['summary']}",
        "",
        f"Workload: {w['description']}. Network: {record['net']['description']}.",
        f"Command: `{record['command']}`",
        "",
        table(record),
        "",
    ]
    if "timeshift" in record:
        lines += [timeshift_text(record["timeshift"]), ""]
    failed = {
        name: p["summary"]["failed_jobs"] for name, p in record["policies"].items() if p["summary"]["failed_jobs"]
    }
    if failed:
        lines += [
            "Jobs that could never be placed (failed, as the controller fails them, and left out of the "
            "figures): " + ", ".join(f"{name} {n}" for name, n in failed.items()) + ".",
            "",
        ]
    if extra:
        lines += [extra, ""]
    lines += [
        "JCT: arrival to last iteration. Queueing: arrival to GPUs granted. GPUs held / computing: time "
        "averages over the makespan, of the GPUs jobs hold, and of those computing (the rest wait on the "
        "network, on circuits, or on a time shift). Dark time: summed OCS switching windows.",
        "",
    ]
    return "\n".join(lines)


def write(out: Path, record: dict, extra: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.json", out / "summary.md", out / "jobs.csv"]
    files[0].write_text(json.dumps(record, indent=1))
    files[1].write_text(markdown(record, extra))
    with files[2].open("w", newline="") as f:
        fields = [
            "policy",
            "id",
            "gpus",
            "model",
            "iterations",
            "arrival_s",
            "placed_s",
            "start_s",
            "end_s",
            "jct_s",
            "queue_s",
            "switches",
            "shared",
            "shift_s",
            "moves",
            "mean_iteration_s",
        ]
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        for name, p in record["policies"].items():
            for row in p["jobs"]:
                w.writerow({"policy": name, **row})
    return files

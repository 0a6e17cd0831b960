"""What `optirack simulate` writes: results.json, summary.md and jobs.csv (plots: simulator/cli/plots.py)."""
from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

from simulator.model import neighbours
from simulator.studies import metrics
from simulator.studies.study import Study


def _s(x: float) -> str:
    if x != x:  # nan
        return "-"
    return f"{x:,.0f} s" if abs(x) >= 100 else f"{x:.1f} s" if abs(x) >= 1 else f"{1000 * x:.1f} ms"


DETAIL_LIMIT = 2000
"""Runs of at most this many jobs keep every job's row in results.json and jobs.csv; larger ones keep summaries and
distributions (CDF_POINTS quantiles), and write the rows, gzipped, only with --detail."""
CDF_POINTS = 200


def rows_kept(study: Study) -> bool:
    return len(study.jobs) <= DETAIL_LIMIT


def run_figures(study: Study, name: str) -> dict:
    """One run's own part of the record (its label, summary, utilization, fragmentation, and its jobs' rows or their
    distributions): `build`'s, or `run_all`'s `figures` (made while another process still runs a policy)."""
    run, gpus = study.runs[name], len(study.rack.gpus)
    ports = max((len(study.rack.downlink_ports(w)) for w in study.rack.aggregators()), default=1)
    out = {
        "label": run.policy.label,
        "summary": metrics.summary(run, gpus, study.wall_s[name]),
        "utilization": metrics.utilization(run, gpus),
        "fragmentation": metrics.fragmentation(run, ports),
    }
    if rows_kept(study):
        out["jobs"] = metrics.job_rows(run, len(study.jobs) <= 500)
    else:
        done = [j for j in run.jobs if not j.failed]
        out["cdf"] = {key: metrics.quantiles([max(getattr(j, key), 0.0) for j in done], CDF_POINTS)
                      for key in ("jct_s", "queue_s")}
    return out


def build(study: Study, meta: dict, baseline: str | None = None) -> dict:
    record = {**meta, "policies": {}}
    for name in study.runs:
        figures = study.figures.get(name)
        record["policies"][name] = dict(figures) if isinstance(figures, dict) else run_figures(study, name)
    base = baseline or next(iter(study.runs))
    record["baseline"] = base
    for p in record["policies"].values():
        p["against_baseline"] = metrics.against(p["summary"], record["policies"][base]["summary"])
    names = list(study.runs)
    record["equal"] = [
        {"policies": [a, b], "why": why}
        for i, a in enumerate(names)
        for b in names[i + 1:]
        if (why := metrics.why_equal(study.runs[a], study.runs[b]))
    ]
    if "regroup" in study.runs and "timeshift" in study.runs:
        record["timeshift"] = metrics.timeshift_gain(study.runs["regroup"], study.runs["timeshift"])
        record["timeshift"]["held"] = record.get("net", {}).get("sharing") == "held"
    if "regroup" in study.runs and "mltcp" in study.runs:  # MLTCP beside regroup (simulator/model/neighbours.py)
        record["mltcp"] = neighbours.mltcp_gain(study.runs["regroup"], study.runs["mltcp"])
    return record


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:+.1f} %"


def _share(x: float, digits: int) -> str:
    """A share in percent; '-' where it is not defined (no steady window: every job arrived at once, as in --case)."""
    return "-" if x != x else f"{100 * x:.{digits}f} %"


def _x(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"


def field_table(record: dict) -> str:
    """The field's figures per policy: completion time and slowdown (mean, p50, p95, p99), queueing,
    steady-state utilization, fragmentation, and the change against the baseline policy."""
    base = record.get("baseline")
    rows = [
        "| policy | JCT mean / p50 / p95 / p99 | slowdown mean / p50 / p95 / p99 | queueing mean / p95 | makespan "
        "| steady held / computing | one switch's reach "
        f"| vs {base}: JCT mean, p95, slowdown mean, steady computing |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, p in record["policies"].items():
        s, a, f = p["summary"], p.get("against_baseline", {}), p.get("fragmentation") or {}
        j, sl, q, st = s["jct_s"], s["slowdown"], s["queue_s"], s["steady"]
        vs = "baseline" if name == base else ", ".join(
            _pct(a.get(k, float("nan"))) for k in ("jct_s.mean", "jct_s.p95", "slowdown.mean", "steady.computing"))
        rows.append(
            f"| {name} | {_s(j['mean'])} / {_s(j['p50'])} / {_s(j['p95'])} / {_s(j['p99'])} "
            f"| {_x(sl['mean'])} / {_x(sl['p50'])} / {_x(sl['p95'])} / {_x(sl['p99'])} "
            f"| {_s(q['mean'])} / {_s(q['p95'])} | {_s(s['makespan_s'])} "
            f"| {_share(st['held'], 1)} / {_share(st['computing'], 1)} "
            f"| {_share(f.get('mean_reachable', float('nan')), 0)} | {vs} |"
        )
    return "\n".join(rows)


def size_table(record: dict) -> str:
    base = record.get("baseline")
    classes = list(dict.fromkeys(c for p in record["policies"].values() for c in p["summary"]["by_size"]))
    rows = ["| policy | GPUs | jobs | JCT mean / p95 | slowdown mean / p95 | queueing mean | JCT mean vs "
            f"{base} |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, p in record["policies"].items():
        for c in classes:
            d = p["summary"]["by_size"].get(c)
            if not d:
                continue
            b = record["policies"][base]["summary"]["by_size"].get(c) if base else None
            vs = "baseline" if name == base else _pct(metrics.percent_change(d["jct_s"]["mean"], b["jct_s"]["mean"])) \
                if b else "-"
            rows.append(f"| {name} | {c} | {d['jobs']} | {_s(d['jct_s']['mean'])} / {_s(d['jct_s']['p95'])} "
                        f"| {_x(d['slowdown']['mean'])} / {_x(d['slowdown']['p95'])} | {_s(d['queue_s']['mean'])} "
                        f"| {vs} |")
    return "\n".join(rows)


def failure_table(record: dict) -> str:
    """Per run: server failures, the jobs' interruptions, the work redone, and goodput (useful GPU-hours over
    GPU-hours held)."""
    rows = ["| run | server failures | interruptions | iterations redone | GPU-h lost | GPU-h restarting "
            "| GPU-h held | goodput |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, p in record["policies"].items():
        s = p["summary"]
        held = s["gpu_held"] * s["makespan_s"] * record["rack"]["gpus"]
        rows.append(f"| {name} | {s['failures']:,} | {s['interruptions']:,} | {s['redone_iterations']:,.0f} "
                    f"| {s['lost_gpu_s'] / 3600:,.1f} | {s['restart_gpu_s'] / 3600:,.1f} | {held / 3600:,.0f} "
                    f"| {100 * s['goodput']:.2f} % |")
    return "\n".join(rows)


def equal_text(record: dict) -> str:
    return "\n".join(f"- {a} and {b} gave every job the same completion time: {e['why']}."
                     for e in record.get("equal", []) for a, b in [e["policies"]])


def seeds_table(seeds: dict) -> str:
    base = seeds["baseline"]
    rows = [f"Over {seeds['n']} seeds ({', '.join(map(str, seeds['seeds']))}): mean ± 95 % interval (Student's t).",
            "", f"| policy | JCT mean | JCT p95 | slowdown mean | steady computing | JCT mean vs {base} |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, p in seeds["policies"].items():
        def f(key, fmt, p=p):
            v = p[key]
            half = f"{v['ci95']:.1f} %" if fmt is _pct else fmt(v["ci95"])
            return f"{fmt(v['mean'])} ± {half}" if v["ci95"] == v["ci95"] else fmt(v["mean"])
        rows.append(f"| {name} | {f('jct_mean', _s)} | {f('jct_p95', _s)} | {f('slowdown_mean', _x)} "
                    f"| {f('steady_computing', lambda x: f'{100 * x:.1f} %')} "
                    f"| {'baseline' if name == base else f('jct_mean_vs_baseline', _pct)} |")
    return "\n".join(rows)


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


def timeshift_why(ts: dict) -> str:
    """Why time shifting saved nothing on a run (the jobs' counts of simulator.studies.metrics.timeshift_gain)."""
    n, why = ts["jobs"], []
    if ts.get("held"):
        return ("Shifting saved nothing: shares are held (--sharing held): a computing ring's share stays idle, so "
                "interleaving frees nothing, and no job is shifted.")
    if ts.get("first"):
        why.append(f"{ts['first']} of {n} were placed before the rings they came to share with (the later ones "
                   "are the ones shifted)")
    if ts.get("fit"):
        why.append(f"for {ts['fit']} of {n} the rings' summed peak demand fit every link they shared, so there "
                   "was no excess to shift away")
    if ts.get("no_better"):
        why.append(f"for {ts['no_better']} no delay scored better than none (their traffic fills the pauses "
                   "it could move into)")
    if ts.get("shifted"):
        were = "was" if ts["shifted"] == 1 else "were"
        why.append(f"{ts['shifted']} {were} shifted, but the delay of their first iteration cost as much as "
                   "interleaving saved (or later arrivals overlapped them again)")
    return "Shifting saved nothing: " + "; ".join(why) + "."


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
        + (" " + timeshift_why(ts) if ts["saved"] <= 0.0005 and "fit" in ts else "")
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
        "## The field's figures",
        "",
        field_table(record),
        "",
        f"Steady state: {next(iter(record['policies'].values()))['summary']['steady']['window']}. Slowdown: "
        "completion time (arrival to end) over the job's run time alone where it was first placed. One switch's "
        "reach: time average of the most free GPUs one switch holds without rewiring, as a share of what it could "
        "hold (its downlinks, or all free GPUs when fewer).",
        "",
        "## Per job size",
        "",
        size_table(record),
        "",
    ]
    if (record.get("options") or {}).get("failures"):
        lines += ["## Server failures and goodput", "", record["options"]["failures"]["description"] + ".", "",
                  failure_table(record), ""]
    if record.get("equal"):
        lines += ["## Where policies tie", "", equal_text(record), ""]
    if record.get("seeds"):
        lines += ["## Over seeds", "", seeds_table(record["seeds"]), ""]
    if "timeshift" in record:
        lines += [timeshift_text(record["timeshift"]), ""]
    if "mltcp" in record:
        lines += [neighbours.mltcp_text(record["mltcp"]), ""]
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


def write(out: Path, record: dict, extra: str = "", study: Study | None = None, detail: bool = False) -> list[Path]:
    """results.json and summary.md; every job's row in jobs.csv when the record keeps them, else in jobs.csv.gz
    with `detail` (from `study`)."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.json", out / "summary.md"]
    files[0].write_text(json.dumps(record, indent=1 if all("jobs" in p for p in record["policies"].values()) else None))
    files[1].write_text(markdown(record, extra))
    if all("jobs" in p for p in record["policies"].values()):
        files.append(out / "jobs.csv")
        with files[-1].open("w", newline="") as f:
            _rows(f, ((name, p["jobs"]) for name, p in record["policies"].items()))
    elif detail and study is not None:
        files.append(out / "jobs.csv.gz")
        with gzip.open(files[-1], "wt", newline="", compresslevel=6) as f:
            _rows(f, ((name, metrics.job_rows(run, False)) for name, run in study.runs.items()))
    return files


def _rows(f, policies) -> None:
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
        "slowdown",
    ]
    w = csv.DictWriter(f, fields, extrasaction="ignore")
    w.writeheader()
    for name, rows in policies:
        for row in rows:
            w.writerow({"policy": name, **row})

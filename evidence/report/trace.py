"""make report's blocks of the simulator's trace check (engine.py merges BLOCKS), in
docs/simulator.md and docs/simulator-fidelity.md: sim-trace-replay (every replay record of the current model,
results/replay/*.json, beside the simulator: evidence/tracecheck.py), sim-trace-verdict (the verdict over those
records: evidence/tracejudge.py), sim-trace-lags (the emulation's lags the model charges, each from the records it
was measured on: evidence/tracefit.py) and sim-trace-insample (the model on its own tuning replays, with and
without the lags).

Each block takes `results`, the folder the records lie in (results/ of the checkout by default); a record that is
missing or lacks what the block needs raises ReportError naming the file.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from evidence.report.bench import RESULTS, ROOT, ReportError
from evidence.report.bench import read_text as _read

TRACE_RACK = ROOT / "topologies" / "trace16.yaml"
TRACE = ROOT / "traces" / "trace16.csv"
# The traces whose verdict the sim-trace-verdict block shows, each by the bars in force: the one the model's lags
# were fitted on, then three it was never fitted on (docs/trace-check.md says each one's part).
JUDGED = (TRACE, *(ROOT / "traces" / f"trace16-{n}.csv" for n in ("small", "bursty", "even", "after", "v4a", "v4b")))


def trace_of(record: dict) -> Path:
    """The committed trace a replay record replayed: traces/<the name of its `trace_file`> (a record without one
    replayed trace16.csv). By name, not by the file's sha256, which a reworded comment changes."""
    name = Path(record.get("trace_file") or TRACE.name).name
    path = ROOT / "traces" / name
    if not path.is_file():
        raise KeyError(f"the record's trace {name} is not under traces/")
    return path


def trace_comparisons(results: Path = RESULTS, fingerprint: str | None = None,
                      trace: Path = TRACE) -> tuple[list, list[str], str]:
    """Every replay record of `trace` by the current model (results/replay/*.json; its fingerprint,
    evidence/records.py) beside the simulator's run of the same jobs (evidence/tracecheck.py): (comparisons, the
    records of other models, the current fingerprint)."""
    from simulator import identity

    folder = results / "replay"
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not paths:
        raise ReportError(f"{folder}/*.json: cannot read the record: no trace replay record (make one with "
                          "scripts/replay_trace.py, under the rack lock)")
    current = fingerprint or identity.fingerprint() or "unknown"
    # the same records, unchanged, the same model: the comparisons already made (several blocks show them)
    key = (str(folder), current, str(trace),
           tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in paths))
    if key not in _MADE:
        _MADE[key] = _compare(paths, current, trace)
    return _MADE[key]


_MADE: dict[tuple, tuple[list, list[str], str]] = {}


def _compare(paths: list[Path], current: str, trace_file: Path) -> tuple[list, list[str], str]:
    from evidence import records, tracecheck
    from simulator.inputs.workloads import read_trace

    trace = [{"arrival_s": j.arrival_s, "gpus": j.gpus, "model": j.model, "iterations": j.iterations}
             for j in sorted(read_trace(trace_file), key=lambda j: j.arrival_s)]
    comparisons, skipped = [], []
    for path in paths:
        try:
            record = json.loads(_read(path))
            if trace_of(record) != trace_file:
                continue
            if records.fingerprint_of(path, record) != current:
                skipped.append(path.stem)
                continue
            comparisons.append((path.stem, tracecheck.compare_record(record, trace, ROOT / record["rack_file"])))
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"{path}: not a trace replay record ({type(e).__name__}: {e})") from None
    return comparisons, skipped, current


def _no_replay(current: str, skipped: list[str]) -> str:
    return (f"No trace replay record was made with the current model (fingerprint {current[:12]}) yet: nothing "
            f"checks it "
            f"(made with another model: {', '.join(skipped)}).")


def verdict_lines(trace_name: str, comparisons: list, fingerprint: str) -> list[str]:
    """One trace's verdict over `comparisons` (tracecheck.compare_record's, by record) of the model `fingerprint`,
    by the bars in force when each record was made: the literal result of every replay beside the noise-aware one,
    or that its replays are still to be made."""
    from evidence import tracejudge

    out = [f"**`traces/{trace_name}`**", ""]
    if not comparisons:
        return out + [f"No replay by the current model ({fingerprint[:12]}) yet: its replays are pending.", ""]
    groups, unjudged = tracejudge.judge(comparisons, fingerprint)
    for g in groups:
        lit, noise = tracejudge.misses(g)
        out += [tracejudge.table(g), ""]
        out.append(f"Literal bars ({len(g['records'])} replays): " + (
            "every bar met." if not lit else "missed: " + "; ".join(lit) + "."))
        out += ["", "Noise-aware bars: " + ("none set before these replays." if noise is None else "every bar met."
                                            if not noise else "missed: " + "; ".join(noise) + "."), ""]
    if unjudged:
        out.append(f"Judged by no bars (made before any bars of the model were set): {', '.join(unjudged)}.")
    return out + [""]


def sim_trace_verdict(_records: list, results: Path = RESULTS, fingerprint: str | None = None) -> str:
    """The trace check's verdict on each judged trace (JUDGED) over the replay records of the current model, by the
    bars in force when each was made (evidence/tracejudge.py, evidence/bars/): the literal result of every replay
    beside the noise-aware one, or that the trace's replays are still to be made."""
    out = []
    for trace in JUDGED:
        comparisons, _, current = trace_comparisons(results, fingerprint, trace)
        out += verdict_lines(trace.name, comparisons, current)
    return "\n".join(out).rstrip("\n")


def sim_trace_verdict_earlier(_records: list, results: Path = RESULTS, fingerprint: str | None = None) -> str:
    """The verdicts of the models before the current one, each as its kept verdict record gives it
    (results/verdicts/*.json, evidence/verdicts.py: its comparisons, made at that model's last commit; load_verdicts),
    rendered as
    sim-trace-verdict renders the current model's: a changed model never takes an earlier one's misses off the page."""
    from simulator import identity

    folder = results / "replay"
    if not (folder.is_dir() and any(folder.glob("*.json"))):
        raise ReportError(f"{folder}/*.json: cannot read the record: no trace replay record")
    current = fingerprint or identity.fingerprint() or "unknown"
    out = []
    for kept in load_verdicts(results):
        if kept["model_fingerprint"] == current:
            continue
        out += [f"### The model {kept['model_fingerprint'][:12]} (until commit {kept['commit'][:7]}; "
                f"`{kept['path']}`)", ""]
        for trace_name, comparisons in kept["traces"].items():
            out += verdict_lines(trace_name, comparisons, kept["model_fingerprint"])
    if not out:
        return f"None yet: every verdict above is of the current model ({current[:12]})."
    return "\n".join(out).rstrip("\n")


VERDICTS = "verdicts"  # results/verdicts/<fingerprint, 12 hex>.json: a model's verdict, kept (evidence/verdicts.py)


def load_verdicts(results: Path = RESULTS) -> list[dict]:
    """Every kept verdict record (evidence/verdicts.py), by name, each with `path` (from the results folder's parent)
    and its traces' comparisons as (record, by policy) pairs again."""
    folder = results / VERDICTS
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(_read(path))
            data["traces"] = {t: [(name, by) for name, by in comps] for t, comps in data["traces"].items()}
            data["model_fingerprint"], data["commit"]  # noqa: B018 (both required)
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"{path}: not a verdict record ({type(e).__name__}: {e})") from None
        data["path"] = f"{results.name}/{VERDICTS}/{path.name}"
        out.append(data)
    return out


def sim_trace_replay(_records: list, results: Path = RESULTS, fingerprint: str | None = None) -> str:
    """The trace check: every replay record of the current model (results/replay/*.json, scripts/replay_trace.py)
    beside the simulator's run of the same jobs on the same rack file (evidence/tracecheck.py), a row per
    record and policy, then the three jobs furthest off in each."""
    from evidence import tracecheck

    comparisons, skipped, current = trace_comparisons(results, fingerprint)
    if not comparisons:  # a model just changed: its replays are still to be made
        return _no_replay(current, skipped)
    lines = [tracecheck.table(comparisons), ""]
    for name, by_policy in comparisons:
        for policy, c in by_policy.items():
            worst = ", ".join(f"j{j['index'] + 1} {j['jct_emulated_s']:.1f} → {j['jct_simulated_s']:.1f} s "
                              f"({100 * j['error']:+.1f} %)" for j in c["largest_errors"])
            lines.append(f"- `{name}`, {policy}: furthest off {worst}")
    if skipped:
        lines.append(f"- not compared (made with another model): {', '.join(skipped)}")
    return "\n".join(lines)


def sim_trace_unjudged(_records: list, results: Path = RESULTS, fingerprint: str | None = None) -> str:
    """Every replay record of the current model of a trace that neither fits nor judges it (a committed trace not in
    JUDGED, such as trace16-interim.csv: docs/trace-model.md), beside the simulator with the newest bars' literal
    result per record and policy: reported as it comes, no verdict drawn."""
    from evidence import tracecheck

    out = []
    for trace in sorted((ROOT / "traces").glob("trace16*.csv")):
        if trace in JUDGED:
            continue
        comparisons, _, current = trace_comparisons(results, fingerprint, trace)
        out += [f"**`traces/{trace.name}`**", ""]
        out += [tracecheck.table(comparisons) if comparisons else
                f"No replay by the current model ({current[:12]}) yet.", ""]
    return "\n".join(out).rstrip("\n") or "No trace outside the judged ones is committed."


def sim_trace_noise(_records: list, results: Path = RESULTS, fingerprint: str | None = None) -> str:
    """The emulation against itself: each pair of replays of one trace (evidence/tracefit.py's repeatability), per
    policy, for the fit set's traces (tracefit.REPLAYS) and each trace that neither fits nor judges the current model
    (its replays by that model): the range over pairs and policies of the per-job |difference|'s median and p90, and of
    the makespans' difference."""
    from evidence import tracefit

    replays, records, _ = _lag_records(results)
    groups: dict[str, list[tuple[str, dict]]] = {}
    for path, record in zip(replays, records, strict=True):
        groups.setdefault(f"`{trace_of(record).name}` (fit)", []).append((path.stem, record))
    for trace in sorted((ROOT / "traces").glob("trace16*.csv")):
        if trace in JUDGED:
            continue
        names = [name for name, _ in trace_comparisons(results, fingerprint, trace)[0]]
        if names:
            groups[f"`{trace.name}` (fits nothing)"] = [
                (n, json.loads(_read(results / "replay" / f"{n}.json"))) for n in names]
    rows = ["| trace | replays | completion time \\|difference\\|, per pair and policy: median | p90 | makespans |",
            "| --- | --- | --- | --- | --- |"]
    for label, recs in groups.items():
        pairs = [r for i, (_, a) in enumerate(recs) for _, b in recs[i + 1:]
                 for r in tracefit.repeatability(a, b).values()]
        if not pairs:
            continue
        med, p90 = [100 * r["median"] for r in pairs], [100 * r["p90"] for r in pairs]
        span = [100 * (r["makespan_b_s"] / r["makespan_a_s"] - 1) for r in pairs]
        rows.append(f"| {label} | {', '.join(f'`{n}`' for n, _ in recs)} | {min(med):.1f}–{max(med):.1f} % "
                    f"| {min(p90):.1f}–{max(p90):.1f} % | {min(span):+.1f} to {max(span):+.1f} % |")
    return "\n".join(rows)


def _lag_records(results: Path) -> tuple[list[Path], list[dict], list[dict]]:
    """The replay records and the demo records' detailed jobs the lags were chosen on (evidence/tracefit.py),
    under `results`."""
    from evidence import tracefit

    replays = [results / p.relative_to(RESULTS) for p in tracefit.REPLAYS]
    records = [json.loads(_read(p)) for p in replays]
    demo = []
    for path in (results / p.relative_to(RESULTS) for p in tracefit.DEMO):
        try:
            demo += tracefit.demo_jobs(json.loads(_read(path)))
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"{path}: not a make demo record ({type(e).__name__}: {e})") from None
    return replays, records, demo


def sim_trace_lags(_records: list, results: Path = RESULTS) -> str:
    """The emulation's lags (simulator/model/lags.py) as `python -m evidence.tracefit` measures them on the records they
    were chosen on, beside the constants."""
    from evidence import tracefit
    from simulator.model import lags

    replays, records, demo = _lag_records(results)
    try:
        f = tracefit.fit(tracefit.host_runs(records), demo, records[0]["time_dilation"],
                         ROOT / records[0]["rack_file"])
        probes = tracefit.probes(records)
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{', '.join(map(str, replays))}: not trace replay records ({type(e).__name__}: {e})") \
            from None

    def spread(values: list[float], what: str) -> str:
        return f"{min(values):.2f}–{max(values):.2f} s, {len(values)} {what}"

    slope = f["iteration beyond compute, per GB of gradient (the line's slope)"]

    rows = [
        ("probe", "the host's probe: its two jobs' GPUs granted to first iteration, summed (each replay's host factor "
         "is its median over this)", f"{lags.PROBE_S:.3f} s", spread(probes, "policy runs")),
        ("containers", "GPUs granted to the containers started (`started_at`, the start the check compares)",
         f"{lags.CONTAINERS_S:.3f} s + {lags.CONTAINERS_PER_GPU_S:.3f} s per GPU starting + "
         f"{lags.CONTAINERS_PER_BUSY_GPU_S:.3f} s per GPU of other jobs iterating",
         spread(f["GPUs granted to containers started"], "jobs")),
        ("start", "containers started to the first iteration (torch's import, the ring's rendezvous)",
         f"{lags.START_S:.3f} s + {lags.START_PER_GPU_S:.3f} s per GPU starting + "
         f"{lags.START_PER_BUSY_GPU_S:.3f} s per GPU of other jobs iterating", spread(f["start to first iteration"],
                                                                                      "jobs")),
        ("end", "the latest rank's last iteration to `ended_at` (the 1-GPU jobs' line's intercept)",
         f"{lags.END_S:.3f} s", spread(f["1-GPU jobs, first iteration to ended_at beyond compute"], "1-GPU jobs")),
        ("release", "`ended_at` to the GPUs free again, before the next queued job's containers",
         f"{lags.RELEASE_S:.3f} s", spread(f["release (that less the containers')"], "jobs")),
        ("iteration", "each iteration beyond its compute on the loaded host, per GB of the job's gradient (filling "
         "and checking it; the 1-GPU jobs' line's slope)", f"{lags.ITERATION_PER_GB_S:.4f} s per GB "
         f"(+ {lags.ITERATION_S:.4f} s)", f"{slope:.4f} s per GB (slope), over the 1-GPU jobs"),
    ]
    out = ["| lag (simulator/model/lags.py) | what it is | the constant, emulated s | measured values |",
           "| --- | --- | --- | --- |"]
    return "\n".join(out + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows])


def sim_trace_insample(_records: list, results: Path = RESULTS) -> str:
    """The trace check on the replay records the lags were fitted on (in sample: the freeze's test, not a verdict):
    each record and policy with the lags at its host factor, then each fit trace's policies against its replays' mean,
    the freeze's criterion (docs/trace-model.md): per-job median and p90 |error| within the bars."""
    from evidence import tracebars, tracecheck, tracejudge
    from simulator.inputs.workloads import read_trace

    replays, records, _ = _lag_records(results)
    _, cal_name = tracecheck.calibration_for("lossless")
    rows = ["| record | trace | host factor | policy | completion time: median / p90 of \\|error\\| "
            "| queueing, mean: emulated → simulated | makespan: emulated → simulated | start order |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    by_trace: dict[str, list] = {}
    for replay, record in zip(replays, records, strict=True):
        path = trace_of(record)
        trace = [{"arrival_s": j.arrival_s, "gpus": j.gpus, "model": j.model, "iterations": j.iterations}
                 for j in sorted(read_trace(path), key=lambda j: j.arrival_s)]
        compared = tracecheck.compare_record(record, trace, ROOT / record["rack_file"])
        by_trace.setdefault(path.name, []).append(compared)
        for policy, c in compared.items():
            order = "the same" if c["start_order_same"] else f"{len(c['start_order_discordant'])} pairs differ"
            rows.append(f"| `{replay.stem}` | `{path.name}` | {c['host']:.3f} | {policy} "
                        f"| {100 * c['jct_error_median']:.1f} % / {100 * c['jct_error_p90']:.1f} % "
                        f"| {c['queue_emulated_mean_s']:.1f} → {c['queue_simulated_mean_s']:.1f} s "
                        f"| {c['makespan_emulated_s']:.1f} → {c['makespan_simulated_s']:.1f} s "
                        f"({100 * c['makespan_error']:+.1f} %) | {order} |")
    bars = tracebars.newest().literal
    mean = ["| trace | policy | replays | against the replays' mean: completion time median / p90 \\|error\\| "
            "| makespan | the freeze's per-job bars |", "| --- | --- | --- | --- | --- | --- |"]
    for name, comps in by_trace.items():
        for policy in tracejudge.POLICIES:
            runs = [c[policy] for c in comps if policy in c]
            if not runs:
                continue
            m = tracejudge.against_mean(runs)
            ok = m["jct_error_median"] <= bars["jct_error_median"] and m["jct_error_p90"] <= bars["jct_error_p90"]
            mean.append(f"| `{name}` | {policy} | {len(runs)} | {100 * m['jct_error_median']:.1f} % / "
                        f"{100 * m['jct_error_p90']:.1f} % | {100 * m['makespan_error']:+.1f} % of "
                        f"{m['makespan_emulated_mean_s']:.1f} s | {'met' if ok else 'MISSED'} |")
    return "\n".join(rows + ["", *mean, "", f"(Calibrated by `{cal_name}`.)"])


def sim_trace_bars(_records: list, results: Path = RESULTS) -> str:
    """The trace check's bars, a row per version (evidence/bars/, evidence/tracebars.py), with the committed replay
    records each judges."""
    from evidence import records, tracebars, tracejudge

    versions = tracebars.load()
    judged: dict[int, list[str]] = {}
    paths = sorted((results / "replay").glob("*.json"))
    if not paths:
        raise ReportError(f"{results / 'replay'}/*.json: cannot read the record: no trace replay record")
    for path in paths:
        try:
            fingerprint = records.fingerprint_of(path, json.loads(_read(path)))
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"{path}: not a trace replay record ({type(e).__name__}: {e})") from None
        bars = tracebars.in_force(versions, fingerprint, tracejudge.started(path.stem))
        if bars is not None:
            judged.setdefault(bars.version, []).append(path.stem)

    def bars(b: dict | None, extra: str = "") -> str:
        if b is None:
            return "none"
        return (f"median ≤ {100 * b['jct_error_median']:g} %, p90 ≤ {100 * b['jct_error_p90']:g} %, makespan within "
                f"{100 * b['makespan_error']:g} %, start order {b['start_order']}{extra}")

    rows = ["| version | set (UTC) | model | literal bars, each replay | noise-aware bars, against the replays' mean "
            "| replays it judges |", "| --- | --- | --- | --- | --- | --- |"]
    for v in versions:
        origin = f" (first committed in {v.first_committed_in})" if v.first_committed_in else ""
        na = v.noise_aware and f", over {v.noise_aware['min_replays']} replays or more"
        rows.append(f"| {v.version} (`{v.path.name}`) | {v.set_utc:%Y-%m-%d %H:%M}{origin} | "
                    f"{v.model_fingerprint[:12]} | {bars(v.literal)} | {bars(v.noise_aware, na or '')} "
                    f"| {', '.join(f'`{n}`' for n in judged.get(v.version, [])) or 'none yet'} |")
    return "\n".join(rows)


def sim_trace_traces(_records: list, results: Path = RESULTS) -> str:
    """Each judged trace (JUDGED): how it was made (its first line), its jobs, and the simulator's makespan under
    each policy, whence the replay's expected length (the emulated rack runs at the rack file's time dilation, each
    policy on a fresh testbed); and how many replays of it the current model has."""
    from controller.core.rack import load_rack
    from evidence import records, tracecheck
    from simulator import identity
    from simulator.inputs.workloads import read_trace

    current = identity.fingerprint()
    replayed: dict[str, int] = {}
    paths = sorted((results / "replay").glob("*.json"))
    if not paths:
        raise ReportError(f"{results / 'replay'}/*.json: cannot read the record: no trace replay record")
    for path in paths:
        try:
            record = json.loads(_read(path))
            if records.fingerprint_of(path, record) == current:
                replayed[trace_of(record).name] = replayed.get(trace_of(record).name, 0) + 1
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"{path}: not a trace replay record ({type(e).__name__}: {e})") from None
    dilation = load_rack(TRACE_RACK).spec.emulation.time_dilation
    rows = ["| trace | made by (`python -m scripts.trace_gen` ...) | jobs | GPUs per job | vgg16 | simulated makespan: "
            "fixed / regroup / defrag | one replay, about | replays of the current model |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for trace in JUDGED:
        jobs = sorted(read_trace(trace), key=lambda j: j.arrival_s)
        rows_in = [{"arrival_s": j.arrival_s, "gpus": j.gpus, "model": j.model, "iterations": j.iterations}
                   for j in jobs]
        spans = [max(r["end_s"] for r in tracecheck.simulate(TRACE_RACK, rows_in, p, 30.0 if p == "defrag"
                                                             else 300.0)[0]) for p in ("fixed", "regroup", "defrag")]
        made = trace.read_text().splitlines()[0].split("scripts.trace_gen ", 1)[-1]
        sizes = sorted({j.gpus for j in jobs})
        rows.append(f"| `{trace.name}` | `{made}` | {len(jobs)} | {', '.join(map(str, sizes))} "
                    f"| {100 * sum(j.model == 'vgg16' for j in jobs) / len(jobs):.0f} % "
                    f"| {' / '.join(f'{x:.1f}' for x in spans)} s | {dilation * sum(spans) / 60:.0f} min "
                    f"| {replayed.get(trace.name, 0)} |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[list], str]] = {
    "sim-trace-lags": sim_trace_lags, "sim-trace-insample": sim_trace_insample, "sim-trace-replay": sim_trace_replay,
    "sim-trace-unjudged": sim_trace_unjudged, "sim-trace-noise": sim_trace_noise,
    "sim-trace-verdict": sim_trace_verdict, "sim-trace-verdict-earlier": sim_trace_verdict_earlier,
    "sim-trace-bars": sim_trace_bars,
    "sim-trace-traces": sim_trace_traces,
}

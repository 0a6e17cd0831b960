"""The simulator against a trace replayed on the emulated rack: the same trace on the same rack file,
job by job, under each policy.

scripts/replay_trace.py records the emulated side (every job's submit, start, end, placement and circuit
changes); `simulate` runs the same jobs through the simulator's engine on the same rack file, with the network
calibrated to the emulation (`calibration_for`: the newest current-model `make demo` record's, whose fabric is
the replay's); `compare` sets the two side by side, all in rack seconds:
- per-job completion time (end - arrival): median and p90 of |simulated / emulated - 1|;
- queueing delay (GPUs granted - arrival): the mean of each, and the median of the per-job differences;
  "GPUs granted" is the admission (the controller's `admitted_at`, the simulator's placement) where the record has
  it, else the containers' start (`started_at`; records made before admitted_at was recorded);
- makespan (the last job's end): the relative error;
- the order in which jobs start (GPUs granted, as above): the same list, or the pairs of jobs the two order
  differently. The scheduler's order is the admission's: the controller's queue (controller/jobs/admission.py,
  through the policy of controller/core/admission.py it runs: `fifo` unless started with another) admits the jobs of
  one drain one after the other in the policy's order, each with its own `admitted_at`, where the simulator places
  them at one instant (a tie, ordered by trace index); their containers may then start in another order, which the
  containers' start would count;
- circuit changes: removed plus added circuits over the run, each side.
`checks` holds a comparison to the literal bars (evidence/bars/, read by evidence/tracebars.py: median and p90 of
|error|, the makespan's error, the same start order); `table` renders comparisons for `make report`.

Pure but for `simulate` (which runs the engine); the comparison is unit-tested on synthetic rows.
"""
from __future__ import annotations

import statistics
from pathlib import Path

START_TIE_S = 1e-6  # simulated starts closer than this are one instant: ordered by trace index


def p90(values: list[float]) -> float:
    """The 90th percentile, linear between the closest ranks (statistics.quantiles' inclusive method)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def start_order(rows: list[dict], key: str = "start_s") -> list[int]:
    """Trace indices by start time (ties within START_TIE_S by index)."""
    rows = sorted(rows, key=lambda r: (r[key], r["index"]))
    out, last = [], None
    group: list[int] = []
    for r in rows:
        if last is not None and r[key] - last > START_TIE_S:
            out += sorted(group)
            group = []
        group.append(r["index"])
        last = r[key]
    return out + sorted(group)


def discordant(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    """The pairs of jobs (trace indices, 0-based) that order `a` and order `b` put the other way round."""
    pos = {j: i for i, j in enumerate(b)}
    return [(x, y) for i, x in enumerate(a) for y in a[i + 1:] if pos[x] > pos[y]]


def granted_key(emulated: list[dict], simulated: list[dict]) -> str:
    """The rows' key for "GPUs granted": admit_s where every row of both sides has one, else start_s."""
    return "admit_s" if all(r.get("admit_s") is not None for r in emulated + simulated) else "start_s"


def compare(emulated: list[dict], simulated: list[dict], emulated_changes: int, simulated_changes: int) -> dict:
    """One policy: rows of both sides, each {index, arrival_s, start_s (containers started), end_s} and where
    known admit_s (GPUs granted), rack seconds from the first arrival. Every emulated job must have ended `done`
    (a row with end_s None is an error). Queueing and start order are by admit_s where every row has it."""
    if sorted(r["index"] for r in emulated) != sorted(r["index"] for r in simulated):
        raise ValueError("the emulated and simulated runs hold different jobs")
    unfinished = [r["index"] + 1 for r in emulated + simulated if r.get("end_s") is None]
    if unfinished:
        raise ValueError(f"jobs {sorted(set(unfinished))} have no end: a replay or simulation that did not finish")
    sim = {r["index"]: r for r in simulated}
    key = granted_key(emulated, simulated)
    jobs = []
    for e in sorted(emulated, key=lambda r: r["index"]):
        s = sim[e["index"]]
        jct_e, jct_s = e["end_s"] - e["arrival_s"], s["end_s"] - s["arrival_s"]
        jobs.append({"index": e["index"], "jct_emulated_s": jct_e, "jct_simulated_s": jct_s,
                     "error": jct_s / jct_e - 1, "queue_emulated_s": e[key] - e["arrival_s"],
                     "queue_simulated_s": s[key] - s["arrival_s"]})
    errors = [abs(j["error"]) for j in jobs]
    mk_e, mk_s = max(r["end_s"] for r in emulated), max(r["end_s"] for r in simulated)
    order_e, order_s = start_order(emulated, key), start_order(simulated, key)
    return {
        "granted_by": "admission" if key == "admit_s" else "containers started",
        "jobs": jobs,
        "jct_error_median": statistics.median(errors),
        "jct_error_p90": p90(errors),
        "queue_emulated_mean_s": statistics.mean(j["queue_emulated_s"] for j in jobs),
        "queue_simulated_mean_s": statistics.mean(j["queue_simulated_s"] for j in jobs),
        "queue_difference_median_s": statistics.median(j["queue_simulated_s"] - j["queue_emulated_s"] for j in jobs),
        "makespan_emulated_s": mk_e, "makespan_simulated_s": mk_s, "makespan_error": mk_s / mk_e - 1,
        "start_order_emulated": order_e, "start_order_simulated": order_s,
        "start_order_same": order_e == order_s, "start_order_discordant": discordant(order_e, order_s),
        "circuit_changes_emulated": emulated_changes, "circuit_changes_simulated": simulated_changes,
        "largest_errors": sorted(jobs, key=lambda j: -abs(j["error"]))[:3],
    }


def checks(c: dict, bars=None) -> list[str]:
    """What a comparison fails of the trace check's literal bars (`bars`: a version of evidence/tracebars.py; by
    default the newest; empty: it passes)."""
    from evidence import tracebars

    return tracebars.literal(c, bars or tracebars.newest())


def emulated_rows(run: dict) -> list[dict]:
    """A replay record's policy run (scripts/replay_trace.py) as comparison rows: submit is the arrival, the
    controller's admission (admit_s; None in records made before it was recorded) and containers' start the
    start, its end the end (None unless the job ended done)."""
    return [{"index": j["index"], "arrival_s": j["submit_s"], "admit_s": j.get("admit_s"), "start_s": j["start_s"],
             "end_s": j["end_s"] if j["state"] == "done" else None} for j in run["jobs"]]


# --- the simulated side -----------------------------------------------------------------------------------------
def calibration_for(fabric: str = "lossless"):
    """The network calibration of the newest committed `make demo` record of the current model on `fabric`
    (its measured ring efficiency and the fabric's sharing); without one, of the newest committed record on
    `fabric` of any model (the calibration ring measures the fabric, not the model: a new model's hash has no
    record until `make demo` runs); the provisional one if there is none."""
    from evidence import records
    from simulator import identity

    # What it reads: the records (which git tracks, their files, their fingerprints) and the current fingerprint. The
    # same state, the same answer (a frozen Calibration): kept, as a trace check asks it once per simulated policy.
    folder = records.RECORDS
    files = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.iterdir())) \
        if folder.is_dir() else ()
    tracked = records.committed(folder) if folder.is_dir() else None
    key = (fabric, identity.fingerprint(), files, None if tracked is None else frozenset(tracked))
    if key not in _CALIBRATIONS:
        _CALIBRATIONS[key] = _calibration_for(fabric, records.load())
    return _CALIBRATIONS[key]


_CALIBRATIONS: dict[tuple, tuple] = {}


def _calibration_for(fabric: str, every: list):
    from evidence import records
    from simulator.model import calibration

    for recs in (records.of_current_model(every), [r for r in every if r.full]):
        recs = [r for r in recs if (r.data.get("fabric") or "droptail") == fabric and r.data.get("calibration")]
        if recs:
            return calibration.from_record(recs[-1].data), recs[-1].name
    return calibration.from_record({"fabric": fabric}), None


def simulate(rack_file: Path, trace: list[dict], policy: str, defrag_s: float, with_lags: bool = True,
             one_step: bool = False, scheduler: str = "fifo", host: float = 1.0) -> tuple[list[dict], int]:
    """The trace's jobs through the simulator (simulator/model/tracesim.py) under the queue discipline `scheduler`,
    calibrated as `calibration_for` the rack's fabric says, the lags charged for a host `host` times slower than the
    fit's (simulator/model/lags.py's host_factor)."""
    from controller.core.rack import load_rack
    from simulator.model import tracesim

    cal, _ = calibration_for(load_rack(rack_file).spec.emulation.fabric)
    return tracesim.simulate(rack_file, trace, policy, defrag_s, cal, with_lags, one_step, scheduler, host)


def estimates(rack_file: Path, trace: list[dict]) -> list[float]:
    """Each job's run time (rack s) as the simulator's queue disciplines estimate a waiting job, calibrated as
    `simulate` is (simulator/model/tracesim.py's `estimates`)."""
    from controller.core.rack import load_rack
    from simulator.model import tracesim

    cal, _ = calibration_for(load_rack(rack_file).spec.emulation.fabric)
    return tracesim.estimates(rack_file, trace, cal)


def compare_record(record: dict, trace: list[dict], rack_file: Path, with_lags: bool = True,
                   one_step: bool = False) -> dict[str, dict]:
    """Every policy of a replay record beside the simulator's run of the same jobs under the queue discipline the
    controller ran (the run's `scheduler`; fifo in records made before the controller had another), `with_lags`,
    `one_step`: as `simulate`'s. The lags are charged at the record's host's speed (its probe: lags.host_factor; a
    record without a probe at the fit's host's, factor 1), which each comparison keeps as `host`."""
    from simulator.model import lags

    host = lags.host_factor(record)
    out = {}
    for policy, run in record["policies"].items():
        jobs = trace[: record["jobs_replayed"]]
        sim, changes = simulate(rack_file, jobs, policy, run.get("defrag_interval_s") or 300.0, with_lags, one_step,
                                run.get("scheduler", "fifo"), 1.0 if host is None else host)
        out[policy] = {**compare(emulated_rows(run), sim, run["summary"]["circuit_changes"], changes),
                       "scheduler": run.get("scheduler", "fifo"), "host": host}
    return out


def table(comparisons: list[tuple[str, dict[str, dict]]]) -> str:
    """A row per (record, policy): the comparison's figures and what it fails."""
    rows = ["| record | policy | completion time: median / p90 of \\|error\\| | queueing, mean: emulated → simulated "
            "| makespan: emulated → simulated | same start order | circuit changes: emulated / simulated | "
            "within the bounds |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, by_policy in comparisons:
        for policy, c in by_policy.items():
            bad = checks(c)
            order = "yes" if c["start_order_same"] else f"no ({len(c['start_order_discordant'])} pairs)"
            rows.append(
                f"| `{name}` | {policy} | {100 * c['jct_error_median']:.1f} % / {100 * c['jct_error_p90']:.1f} % "
                f"| {c['queue_emulated_mean_s']:.1f} → {c['queue_simulated_mean_s']:.1f} s "
                f"| {c['makespan_emulated_s']:.1f} → {c['makespan_simulated_s']:.1f} s "
                f"({100 * c['makespan_error']:+.1f} %) | {order} "
                f"| {c['circuit_changes_emulated']} / {c['circuit_changes_simulated']} "
                f"| {'yes' if not bad else 'NO: ' + '; '.join(bad)} |")
    return "\n".join(rows)


def start_delays(run: dict) -> list[float]:
    """Each replayed job's time from its start (GPUs granted) to its first iteration, rack seconds: the
    containers' start, which the simulator does not model."""
    return [j["first_iteration_s"] - j["start_s"] for j in run["jobs"] if j.get("first_iteration_s") is not None]


def record_trace(record: dict, root: Path) -> Path:
    """The trace a replay record replayed: its `trace_file` (relative to the repository, or as written), whose bytes
    must still hash to its `trace_sha256` where the record has one."""
    import hashlib

    if "trace_file" not in record:
        raise KeyError("the record names no trace_file: give --trace")
    name = Path(record["trace_file"])
    path = name if name.is_absolute() and name.exists() else root / name if (root / name).exists() else \
        root / "traces" / name.name
    want = record.get("trace_sha256")
    if want and hashlib.sha256(path.read_bytes()).hexdigest() != want:
        raise ValueError(f"{path} is not the trace the record replayed (its sha256 differs from trace_sha256): "
                         "give the right one with --trace")
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m evidence.tracecheck RECORD...`: each replay record beside the simulator, and each policy's start
    delays (start to first iteration)."""
    import argparse
    import json
    import sys

    from simulator.inputs.workloads import read_trace

    ap = argparse.ArgumentParser(prog="python -m evidence.tracecheck", description=main.__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", type=Path, help="results/replay/*.json (scripts/replay_trace.py)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="the trace the records replayed (default: each record's own trace_file, checked against its "
                    "trace_sha256)")
    ap.add_argument("--no-lags", action="store_true",
                    help="simulate without the emulation's lags (simulator/model/lags.py): the model before them")
    ap.add_argument("--one-step", action="store_true",
                    help="every ring step costs STEP_S whatever its chunk (the model before SMALL_STEP_S)")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    out = []
    for path in args.records:
        try:
            record = json.loads(path.read_text())
            trace_path = args.trace or record_trace(record, root)
            trace = [{"arrival_s": j.arrival_s, "gpus": j.gpus, "model": j.model, "iterations": j.iterations}
                     for j in sorted(read_trace(trace_path), key=lambda j: j.arrival_s)]
            out.append((path.stem, compare_record(record, trace, root / record["rack_file"], not args.no_lags,
                                                      args.one_step)))
        except (OSError, KeyError, ValueError) as e:
            print(f"tracecheck: {path}: {e}", file=sys.stderr)
            return 2
        for policy, run in record["policies"].items():
            d = start_delays(run)
            print(f"{path.stem} {policy}: start to first iteration {statistics.median(d):.1f} rack s (median; "
                  f"{min(d):.1f}-{max(d):.1f}) over {len(d)} jobs")
    print(table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

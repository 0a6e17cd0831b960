"""The trace check's verdict over the replays of one model: evidence/tracecheck.py compares one replay
record with the simulator, policy by policy; this judges the committed records of the current model together.

- Each record, each policy: median |error| of completion time <= 10 %, p90 <= 20 %, the same start order
  (tracecheck's bounds), job by job against that replay.
- Each policy, over the records: the simulated makespan within 5 % of the mean of the replays' makespans.
- At least three records, each made with the current model (its fingerprint, evidence/records.py).

Why the makespan is judged against the replays' mean and not each replay alone: the emulated rack does not repeat
its own makespan within 5 % (`python -m evidence.tracefit --repeatability --replay RECORD...` prints each policy's
makespans over the replays; docs/simulator.md shows them), so no prediction, however good, can be within 5 % of
each. The spread comes from the host (its two cores run the workers and Open vSwitch; a replay's iterations run a
few percent slower or faster throughout) and from near ties (which of two jobs ends first decides which GPUs a
later job gets, and its iterations differ with them). The mean of the replays is what the emulated rack does on
that trace; a single replay's makespan is one draw. Each record's own makespan error is
still computed and shown (`per_record_makespan`), so a reader sees both.

Pure: it takes tracecheck's comparisons; unit-tested on synthetic ones (tests/unit/test_tracejudge.py) and run on
the committed records (tests/unit/test_trace_records.py).
"""
from __future__ import annotations

import statistics

from evidence import tracecheck
from evidence.tracecheck import MAKESPAN_BOUND

MIN_RECORDS = 3
POLICIES = ("fixed", "regroup", "defrag")

Comparisons = list[tuple[str, dict[str, dict]]]  # (record name, {policy: tracecheck.compare's dict})


def per_record(name: str, policy: str, c: dict) -> list[str]:
    """What one record's policy run fails of the per-job bounds and the start order (tracecheck.checks without its
    makespan, which is judged against the replays' mean; empty: it passes)."""
    return [f"{name} {policy}: {x}" for x in tracecheck.checks({**c, "makespan_error": 0.0})]


def by_policy(comparisons: Comparisons) -> dict[str, dict]:
    """Per policy over the records: each replay's makespan, their mean and spread (longest / shortest - 1), the
    simulated makespan (the mean of the simulator's, which is the same run for every record of one model and
    calibration), its error against the mean, and each record's own error."""
    out = {}
    for policy in POLICIES:
        runs = [(name, by[policy]) for name, by in comparisons if policy in by]
        if not runs:
            continue
        emulated = [c["makespan_emulated_s"] for _, c in runs]
        simulated = statistics.fmean(c["makespan_simulated_s"] for _, c in runs)
        mean = statistics.fmean(emulated)
        out[policy] = {
            "records": [name for name, _ in runs],
            "makespans_emulated_s": emulated,
            "makespan_emulated_mean_s": mean,
            "makespan_emulated_spread": max(emulated) / min(emulated) - 1,
            "makespan_simulated_s": simulated,
            "makespan_error": simulated / mean - 1,
            "per_record_makespan": [c["makespan_error"] for _, c in runs],
        }
    return out


def verdict(comparisons: Comparisons) -> list[str]:
    """Everything the records fail (empty: the check passes)."""
    out = []
    if len(comparisons) < MIN_RECORDS:
        out.append(f"{len(comparisons)} replay record(s) of the current model; the check needs {MIN_RECORDS}")
    for name, by in comparisons:
        missing = [p for p in POLICIES if p not in by]
        if missing:
            out.append(f"{name}: no {', '.join(missing)} run")
        for policy, c in by.items():
            out += per_record(name, policy, c)
    for policy, p in by_policy(comparisons).items():
        if abs(p["makespan_error"]) > MAKESPAN_BOUND:
            out.append(f"{policy}: simulated makespan {p['makespan_simulated_s']:.1f} s is "
                       f"{100 * p['makespan_error']:+.1f} % from the replays' mean "
                       f"{p['makespan_emulated_mean_s']:.1f} s (bound ±{100 * MAKESPAN_BOUND:g} %)")
    return out


def table(comparisons: Comparisons) -> str:
    """A row per policy: the replays' makespans, their mean and spread, the simulator's, and the verdict."""
    rows = ["| policy | records | makespan of each replay | replays' mean (spread) | simulated: vs the mean "
            "| vs each replay | per-job bounds and start order in every replay | within the bounds |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for policy, p in by_policy(comparisons).items():
        per_job = [x for name, by in comparisons if policy in by for x in per_record(name, policy, by[policy])]
        ok = abs(p["makespan_error"]) <= MAKESPAN_BOUND and not per_job
        rows.append(
            f"| {policy} | {len(p['records'])} | {', '.join(f'{m:.1f}' for m in p['makespans_emulated_s'])} s "
            f"| {p['makespan_emulated_mean_s']:.1f} s ({100 * p['makespan_emulated_spread']:.1f} %) "
            f"| {p['makespan_simulated_s']:.1f} s ({100 * p['makespan_error']:+.1f} %) "
            f"| {', '.join(f'{100 * e:+.1f}' for e in p['per_record_makespan'])} % "
            f"| {'yes' if not per_job else 'NO: ' + '; '.join(per_job)} | {'yes' if ok else 'NO'} |")
    return "\n".join(rows)

"""The trace check's verdict over the replays of one trace by one model: evidence/tracecheck.py compares one replay
record with the simulator, policy by policy; this judges the records together, by the bars that were in force when
each was made (evidence/tracebars.py reads them from evidence/bars/).

- The literal bars, each record and policy alone: median |error| of completion time, its p90, the makespan's
  |error|, the same start order; every record is judged by them, and a miss stays a miss.
- The noise-aware bars, where the version in force set them, each policy over the records judged by that version:
  the same figures against the replays' mean, the start order within the replays' own discord.
- Beside them, the emulated rack's own noise: replay against replay of the same trace.

A record made before any bars of its model were set is judged by none (`unjudged`). Pure: it takes tracecheck's
comparisons; unit-tested on synthetic ones (tests/unit/test_tracejudge.py) and run on the committed records
(tests/unit/test_trace_records.py).
"""
from __future__ import annotations

import statistics

from evidence import tracebars
from evidence.tracecheck import discordant, p90

POLICIES = ("fixed", "regroup", "defrag")

Comparisons = list[tuple[str, dict[str, dict]]]  # (record name, {policy: tracecheck.compare's dict})


def started(name: str):
    """A record's start, from its name (<UTC start>-<commit>)."""
    return tracebars.utc(name.split("-", 1)[0])


def against_mean(runs: list[dict]) -> dict:
    """One policy over several replays of one trace (tracecheck.compare's dicts): the simulator against the replays'
    mean (per job and makespan), and the start order's pairs the other way round, the simulator's against each
    replay; and the rack's own noise, replay against replay: the largest over the pairs of replays of the median and
    p90 of |completion time in one / in the other - 1|, the makespans' spread and the start order's pairs."""
    jobs: dict[int, list[float]] = {}
    for c in runs:
        for j in c["jobs"]:
            jobs.setdefault(j["index"], []).append(j["jct_emulated_s"])
    simulated = {j["index"]: j["jct_simulated_s"] for j in runs[0]["jobs"]}
    errors = [abs(simulated[i] / statistics.fmean(v) - 1) for i, v in sorted(jobs.items())]
    mean = statistics.fmean(c["makespan_emulated_s"] for c in runs)
    by_run = [{j["index"]: j["jct_emulated_s"] for j in c["jobs"]} for c in runs]
    pairs = [[abs(b[i] / a[i] - 1) for i in a if i in b] for k, a in enumerate(by_run) for b in by_run[k + 1:]]
    orders = [c["start_order_emulated"] for c in runs]
    sim_order = runs[0]["start_order_simulated"]
    return {
        "replays": len(runs), "makespans_emulated_s": [c["makespan_emulated_s"] for c in runs],
        "jct_error_median": statistics.median(errors), "jct_error_p90": p90(errors),
        "makespan_emulated_mean_s": mean, "makespan_simulated_s": runs[0]["makespan_simulated_s"],
        "makespan_error": runs[0]["makespan_simulated_s"] / mean - 1,
        "makespan_spread": max(c["makespan_emulated_s"] for c in runs) / min(c["makespan_emulated_s"] for c in runs)
        - 1,
        "jct_noise_median": max((statistics.median(x) for x in pairs if x), default=None),
        "jct_noise_p90": max((p90(x) for x in pairs if x), default=None),
        "start_pairs_simulated": max(len(discordant(o, sim_order)) for o in orders),
        "start_pairs_replays": max((len(discordant(a, b)) for i, a in enumerate(orders) for b in orders[i + 1:]),
                                   default=0),
    }


def scheduler(by_policy: dict[str, dict]) -> str:
    """The queue discipline the controller ran in a record (tracecheck.compare_record's `scheduler`; fifo in
    comparisons without one)."""
    return next(iter(by_policy.values()), {}).get("scheduler", "fifo")


def judge(comparisons: Comparisons, fingerprint: str | None,
          versions: list[tracebars.Bars] | None = None) -> tuple[list[dict], list[str]]:
    """The records of one trace, made with the model `fingerprint`, grouped by the bars in force when each was made
    and by the controller's queue discipline (replays queued otherwise are other runs of the trace: never averaged
    together): ([{bars, scheduler, records, literal: {(record, policy): misses}, missing: [...], by_policy: {policy:
    (against_mean's figures, noise-aware misses or None where the bars set none)}}], the records no bars judge)."""
    versions = tracebars.load() if versions is None else versions
    groups: dict[tuple[int, str], tuple[tracebars.Bars, Comparisons]] = {}
    unjudged = []
    for name, by in comparisons:
        bars = tracebars.in_force(versions, fingerprint, started(name))
        if bars is None:
            unjudged.append(name)
        else:
            groups.setdefault((bars.version, scheduler(by)), (bars, []))[1].append((name, by))
    out = []
    for (_, queue), (bars, recs) in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "fifo", kv[0][1])):
        by_policy = {}
        for policy in POLICIES:
            runs = [by[policy] for _, by in recs if policy in by]
            if runs:
                m = against_mean(runs)
                by_policy[policy] = (m, tracebars.noise_aware(m, bars) if bars.noise_aware else None)
        out.append({
            "bars": bars, "scheduler": queue, "records": [name for name, _ in recs],
            "literal": {(name, p): tracebars.literal(c, bars) for name, by in recs for p, c in by.items()},
            "missing": [f"{name}: no {', '.join(p for p in POLICIES if p not in by)} run"
                        for name, by in recs if any(p not in by for p in POLICIES)],
            "by_policy": by_policy,
        })
    return out, unjudged


def misses(group: dict) -> tuple[list[str], list[str] | None]:
    """(the literal misses, the noise-aware misses or None where the bars set no noise-aware bar) of one group."""
    lit = [f"{name} {policy}: {x}" for (name, policy), xs in group["literal"].items() for x in xs] + group["missing"]
    if group["bars"].noise_aware is None:
        return lit, None
    noise = [f"{policy}: {x}" for policy, (_, xs) in group["by_policy"].items() for x in xs or []]
    return lit, noise + group["missing"]


def verdict(comparisons: Comparisons, fingerprint: str | None,
            versions: list[tracebars.Bars] | None = None) -> list[str]:
    """Everything the records fail, literal and noise-aware, each line naming its bars (empty: every bar in force
    is met, and every record is judged by some)."""
    groups, unjudged = judge(comparisons, fingerprint, versions)
    out = [f"{name}: no bars of its model were set before it" for name in unjudged]
    for g in groups:
        lit, noise = misses(g)
        name = g["bars"].name + ("" if g.get("scheduler", "fifo") == "fifo" else f" ({g['scheduler']})")
        out += [f"literal {name}: {x}" for x in lit]
        out += [f"noise-aware {name}: {x}" for x in noise or []]
    return out


def _pct(x: float | None, sign: bool = False) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %" if sign else f"{100 * x:.1f} %"


def table(group: dict) -> str:
    """A row per policy of one group: the literal result of each replay, the simulator against the replays' mean
    and the noise-aware result, and the rack's own noise beside them."""
    bars = group["bars"]
    rows = ["| policy | replays | literal bars, each replay alone | makespan: each replay → simulated "
            "| against the replays' mean: completion time median / p90 \\|error\\|, makespan "
            "| noise-aware bars | replay against replay: completion time median / p90, makespan spread, "
            "start-order pairs |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for policy, (m, noise) in group["by_policy"].items():
        runs = [(name, x) for (name, p), x in group["literal"].items() if p == policy]
        passed = sum(not x for _, x in runs)
        lit = f"{passed} of {len(runs)} pass" + "".join(f"; `{n}`: {'; '.join(x)}" for n, x in runs if x)
        each = ", ".join(f"{x:.1f}" for x in m["makespans_emulated_s"])
        na = ("none set before these replays" if noise is None else "yes" if not noise else "NO: " + "; ".join(noise))
        rows.append(
            f"| {policy} | {m['replays']} | {lit} | {each} → {m['makespan_simulated_s']:.1f} s "
            f"| {_pct(m['jct_error_median'])} / {_pct(m['jct_error_p90'])}, "
            f"{_pct(m['makespan_error'], True)} of {m['makespan_emulated_mean_s']:.1f} s | {na} "
            f"| {_pct(m['jct_noise_median'])} / {_pct(m['jct_noise_p90'])}, {_pct(m['makespan_spread'])}, "
            f"{m['start_pairs_replays']} (simulated: {m['start_pairs_simulated']}) |")
    queue = group.get("scheduler", "fifo")
    under = "" if queue == "fifo" else f", the replays with the controller queueing by {queue}"
    return f"Bars {bars.name} (`{bars.path.name}`){under}:\n\n" + "\n".join(rows)

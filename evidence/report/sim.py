"""make report's blocks from the simulator's committed records (results/simulate-*/, results/bench-simulate.json;
evidence/report/engine.py merges BLOCKS), in docs/simulator.md and the simulator-*.md pages beside it.

Blocks: sim-seeds (1,024 GPUs over three seeds: the "Over seeds" table of results/simulate-1024-seeds/summary.md),
sim-timeshift (the pairs of jobs that shared an uplink on traces/sample.csv, from
results/simulate-sample-timeshift/jobs.csv), sim-4096 and sim-4096-variants (4,096 GPUs, 2,000 jobs, seed 7, and the
same with --spare 1.25 and with --oversubscription 32 --spare 1.5: results/simulate-4096*/summary.md), sim-schedulers
(256 GPUs, the schedulers: results/simulate-256-schedulers/summary.md), sim-bench (16,384 GPUs, 100,000 jobs, timed:
results/bench-simulate.json) and sim-failures (server failures at 4,096 and 16,384 GPUs:
results/simulate-failures-*/summary.md), and sim-readme-run (the droptail-era demo run against the simulator, held
and max-min: tests/data/demo-readme-run.json through simulator.model.fidelity), sim-sweep-gain (regroup's saving over
fixed by oversubscription, job-size mix and load: results/sweep-gain/runs.csv, simulator/studies/sweepgain.py). The
trace
check's blocks (sim-trace-*) are evidence/report/trace.py's.

Most records are the summary.md `optirack simulate` writes (its results.json, with every job's row, is too large to
commit at these sizes), so a block reads the tables of that file by their headers and takes its figures as the
simulator formatted them. Each block takes `results`, the folder the records lie in (results/ of the checkout by
default); a record that is missing or lacks what the block needs raises ReportError naming the file.
"""
from __future__ import annotations

import csv
import io
import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

from evidence.report.bench import ROOT, ReportError, signed
from evidence.report.bench import read_text as _read
from scripts.bench_simulate import LIMIT_BYTES, LIMIT_S

RESULTS = ROOT / "results"
WIDTH = 117  # prose lines of a block
# the docs' names of the policies (the field table's names; the main table has the long labels)
SHORT = {"defrag": "regroup + defragment", "timeshift": "regroup + time shifting"}
# 4,096 GPUs: (record, the options it adds to the base run's command, what they do)
VARIANTS = (("simulate-4096-spare-1.25", "--spare 1.25", "8 spare downlinks per switch"),
            ("simulate-4096-oversubscription-32", "--oversubscription 32 --spare 1.5", "uplinks at one NIC's rate"))
FAILURES = ("simulate-failures-4096", "simulate-failures-16384")
MAIN = ["JCT mean", "JCT median", "JCT p90", "queueing mean", "makespan", "GPUs computing",
        "jobs spread / sharing a link", "circuits changed"]
FIELD = ["JCT mean / p50 / p95 / p99", "slowdown mean / p50 / p95 / p99", "queueing mean / p95", "makespan",
         "steady held / computing"]


# --- reading the records --------------------------------------------------------------------------------
def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(path: Path, first: str, need: list[str], after: str | None = None) -> list[dict[str, str]]:
    """The rows (column → cell) of the first table in summary.md `path` whose header's first cell is `first` (below
    the line that starts with `after`, if given), checked to have the columns `need`."""
    lines = _read(path).splitlines()
    start = 0
    if after is not None:
        start = next((i for i, line in enumerate(lines) if line.startswith(after)), -1)
        if start < 0:
            raise ReportError(f"{path}: no line '{after}'")
    for i in range(start, len(lines) - 1):
        cols = _cells(lines[i])
        if not lines[i].startswith("|") or cols[0] != first or not lines[i + 1].startswith("| ---"):
            continue
        missing = [c for c in need if c not in cols]
        if missing:
            raise ReportError(f"{path}:{i + 1}: the table has no column {', '.join(repr(c) for c in missing)}")
        rows = []
        for n, line in enumerate(lines[i + 2:], i + 3):
            if not line.startswith("|"):
                break
            cells = _cells(line)
            if len(cells) != len(cols):
                raise ReportError(f"{path}:{n}: {len(cells)} cells in a row under a header of {len(cols)}")
            rows.append(dict(zip(cols, cells, strict=True)))
        if not rows:
            raise ReportError(f"{path}:{i + 1}: the table has no rows")
        return rows
    raise ReportError(f"{path}: no table whose first column is '{first}'" + (f" after '{after}'" if after else ""))


def _part(row: dict[str, str], col: str, k: int, path: Path) -> str:
    """The k-th figure of a cell of figures split by ' / '."""
    parts = row[col].split(" / ")
    if k >= len(parts):
        raise ReportError(f"{path}: '{row[col]}' under '{col}' has no figure {k + 1}")
    return parts[k]


def _line(path: Path, pattern: str) -> re.Match:
    m = re.search(pattern, _read(path), re.M)
    if not m:
        raise ReportError(f"{path}: no line matching {pattern!r}")
    return m


def _runs(path: Path) -> list[tuple[str, dict[str, str]]]:
    """(the run's name, its row of the main table) per run of a summary.md: the names from the field table."""
    main = _table(path, "policy", MAIN)
    field = _table(path, "policy", FIELD, after="## The field's figures")
    if len(main) != len(field):
        raise ReportError(f"{path}: {len(main)} runs in the first table, {len(field)} in the field's figures")
    return [(f["policy"], m) for f, m in zip(field, main, strict=True)]


def _rows(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join("|" + "".join(f" {c} |" if c else " |" for c in r) for r in [head, ["---"] * len(head), *rows])


# --- blocks ---------------------------------------------------------------------------------------------
def sim_seeds(_records: list, results: Path = RESULTS) -> str:
    """The summary's table over seeds, the seeds in its first column's name, minus signs as in the prose."""
    path = results / "simulate-1024-seeds" / "summary.md"
    seeds = [int(s) for s in _line(path, r"^Over \d+ seeds \(([\d, ]+)\)")[1].split(",")]
    rows = _table(path, "policy", ["JCT mean", "JCT p95", "slowdown mean", "steady computing"], after="## Over seeds")
    run = f"{seeds[0]}–{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))
    head = [f"policy (seeds {run}, mean ± 95 % interval)", *list(rows[0])[1:]]
    return _rows(head, [[re.sub(r"-(?=\d)", "−", c) for c in r.values()] for r in rows])


def _both(values: list[float], unit: str) -> str:
    """One figure where the jobs' round to the same, else each, ' / ' between."""
    texts = [f"{v:.1f}" for v in values]
    return f"{texts[0] if len(set(texts)) == 1 else ' / '.join(texts)} {unit}"


def sim_timeshift(_records: list, results: Path = RESULTS) -> str:
    """The jobs that shared a link under regroup, grouped by arrival: their mean iteration and completion time
    under regroup and under time shifting, and the largest delay time shifting gave one of them."""
    path = results / "simulate-sample-timeshift" / "jobs.csv"
    try:
        jobs = {(r["policy"], r["id"]): r for r in csv.DictReader(io.StringIO(_read(path)))}
        groups: dict[float, list[str]] = {}
        for (policy, job), r in jobs.items():
            if policy == "regroup" and r["shared"] == "True":
                groups.setdefault(float(r["arrival_s"]), []).append(job)
        if not groups:
            raise ReportError(f"{path}: no job shared a link under regroup")
        rows, sizes = [], set()
        for ids in groups.values():
            reg, ts = [jobs["regroup", j] for j in ids], [jobs["timeshift", j] for j in ids]
            sizes |= {r["gpus"] for r in reg}
            models = list(dict.fromkeys(r["model"] for r in reg))
            together = len({r["start_s"] for r in reg}) == 1
            label = f"{' + '.join(ids)} ({' + '.join(models)}{', start together' if together else ''})"
            shift = max(1000 * float(r["shift_s"]) for r in ts)
            rows.append((not together, [
                label, _both([1000 * float(r["mean_iteration_s"]) for r in reg], "ms"),
                f"{_both([1000 * float(r['mean_iteration_s']) for r in ts], 'ms')} (shift {shift:.1f} ms)",
                _both([float(r["jct_s"]) for r in reg], "s"), _both([float(r["jct_s"]) for r in ts], "s")]))
    except (KeyError, ValueError) as e:
        raise ReportError(f"{path}: not the jobs of a regroup and a timeshift run ({type(e).__name__}: {e})") from None
    each = f"jobs ({sizes.pop()} GPUs each)" if len(sizes) == 1 else "jobs"
    rows.sort(key=lambda r: r[0])  # those that start together (and interleave) first
    return _rows([each, "mean iteration, regroup", "with time shifting", "completion, regroup", "with time shifting"],
                 [r for _, r in rows])


def sim_4096(_records: list, results: Path = RESULTS) -> str:
    path = results / "simulate-4096" / "summary.md"
    head = ["policy", *MAIN[:6], "jobs spread over switches", "circuits changed"]
    return _rows(head, [[SHORT.get(name, name), *(r[c] for c in MAIN[:6]),
                         _part(r, "jobs spread / sharing a link", 0, path), r["circuits changed"]]
                        for name, r in _runs(path)])


def sim_4096_variants(_records: list, results: Path = RESULTS) -> str:
    """Mean JCT and makespan per policy, a row per variant of the 4,096-GPU run (checked against its command)."""
    names, rows = None, []
    for record, options, what in VARIANTS:
        path = results / record / "summary.md"
        command = _line(path, r"^Command: `(.*)`$")[1]
        if f" {options} " not in f"{command} ":
            raise ReportError(f"{path}: made by `{command}`, not with {options}")
        runs = _runs(path)
        if names is None:
            names = [name for name, _ in runs]
        elif [name for name, _ in runs] != names:
            raise ReportError(f"{path}: runs {', '.join(n for n, _ in runs)}, not {', '.join(names)}")
        rows.append([f"`{options}`: {what}", *(f"{r['JCT mean']}, {'makespan ' if not rows and not i else ''}"
                                                f"{r['makespan']}" for i, (_, r) in enumerate(runs))])
    return _rows(["variant", *(SHORT.get(n, n) for n in names or [])], rows)


def sim_schedulers(_records: list, results: Path = RESULTS) -> str:
    path = results / "simulate-256-schedulers" / "summary.md"
    rows = _table(path, "policy", FIELD, after="## The field's figures")
    return _rows(["run", "JCT mean / p95", "slowdown mean", "queueing mean", "makespan", "steady computing"], [
        [r["policy"], f"{_part(r, FIELD[0], 0, path)} / {_part(r, FIELD[0], 2, path)}", _part(r, FIELD[1], 0, path),
         _part(r, FIELD[2], 0, path), r["makespan"], _part(r, FIELD[4], 1, path)] for r in rows])


def sim_bench(_records: list, results: Path = RESULTS) -> str:
    """bench_simulate's record: end to end time and peak memory over its runs, then a line on the bound."""
    path = results / "bench-simulate.json"
    try:
        d = json.loads(_read(path))
        mib = {k: {s: d[k][s] / 2**20 for s in ("min", "median", "max")} for k in ("peak_rss_bytes", "peak_pss_bytes")}
        wall, runs = d["wall_s"], [r["wall_s"] for r in d["runs"]]
        rows = [["end to end", *(f"{wall[s]:,.0f} s" for s in ("min", "median", "max"))],
                *([what, *(f"{mib[k][s]:,.0f} MiB" for s in ("min", "median", "max"))] for k, what in (
                    ("peak_rss_bytes", "peak memory, RSS summed over the processes"),
                    ("peak_pss_bytes", "peak memory, PSS summed (shared pages once)")))]
        before = d.get("before")
        if before:  # the commit before, timed just before each run of this one: its rows beside
            rows = [[f"{rows[0][0]}, {d['commit'][:7]}", *rows[0][1:]],
                    [f"end to end, {before['commit'][:7]} (the commit before, run just before each)",
                     *(f"{before['wall_s'][s]:,.0f} s" for s in ("min", "median", "max"))],
                    *([f"{r[0]}, {d['commit'][:7]}", *r[1:]] for r in rows[1:]),
                    *([f"{what}, {before['commit'][:7]}", *(f"{before[k][s] / 2**20:,.0f} MiB"
                                                             for s in ("min", "median", "max"))]
                      for k, what in (("peak_rss_bytes", "peak memory, RSS summed"),
                                      ("peak_pss_bytes", "peak memory, PSS summed")))]
        less, more = ("memory", "time") if d["peak_rss_bytes"]["max"] / LIMIT_BYTES > wall["max"] / LIMIT_S \
            else ("time", "memory")
        same = "one run" if d["same_results"] is None else d["same_results"]
        text = (f"Runs: {', '.join(f'{s:,.0f} s' for s in runs)}; the same results every run (the same hash): "
                f"{same}; written: {d['out_bytes'] / 2**20:.1f} MiB ({', '.join(d['files'])}). "
                f"Within {LIMIT_S / 60:.0f} min and {LIMIT_BYTES / 2**30:.0f} GB: "
                f"**{'yes' if d['within_limits'] else 'no'}**, {wall['min'] / 60:.1f}–{wall['max'] / 60:.1f} min and "
                f"at most {mib['peak_rss_bytes']['max']:,.0f} MiB (the {less} with less room than the {more}).")
        if before:
            text += (f" {d['commit'][:7]} against {before['commit'][:7]}: **{d['speedup']:.2f}x** as fast (median "
                     f"over median); every run's figures the same as the commit before's (the same hash): "
                     f"**{'yes' if d['same_results_as_before'] else 'no'}**.")
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{path}: not a bench_simulate record ({type(e).__name__}: {e})") from None
    return _rows(["", "min", "median", "max"], rows) + "\n\n" + textwrap.fill(text, WIDTH)


def sim_failures(_records: list, results: Path = RESULTS) -> str:
    cols = ["server failures", "interruptions", "iterations redone", "GPU-h lost", "GPU-h restarting", "GPU-h held",
            "goodput"]
    rows = []
    for record in FAILURES:
        path = results / record / "summary.md"
        gpus = int(_line(path, r"^# optirack simulate: .*?(\d+) GPUs")[1])
        rows += [[f"{gpus:,}", r["run"], *(r[c] for c in cols)] for r in _table(path, "run", cols)]
    return _rows(["GPUs", "run", *cols], rows)


README_RUN = ROOT / "tests" / "data" / "demo-readme-run.json"


def sim_readme_run(_records: list, data: Path = README_RUN.parent) -> str:
    """Case (a) of the droptail-era demo run the README once quoted: emulated against the model of that emulation
    (held) and max-min, at each NIC:uplink point (tests/unit/test_sim_fidelity.py checks the same figures)."""
    from simulator.model import fidelity

    rec = json.loads(_read(data / README_RUN.name))
    held, _ = fidelity.compare(rec, case="a")
    maxmin, _ = fidelity.compare(rec, case="a", sharing="maxmin")
    nic = rec["rack"]["servers"][0]["gpus"][0]["nic"]["rate_gbps"]

    def sim(p) -> str:
        return f"{p.simulated_s:.3f} s ({signed(100 * p.error)} %)"

    points: dict[float, dict[str, tuple]] = {}
    for h, m in zip(held, maxmin, strict=True):
        points.setdefault(h.uplink_gbps, {})[h.policy] = (h, m)
    rows = []
    for uplink, by in sorted(points.items(), reverse=True):
        (fh, fm), (rh, _) = by["fixed"], by["regroup"]
        rows.append([f"1:{nic / uplink:g}", f"{fh.emulated_s:.3f} s", sim(fh), sim(fm), f"{rh.emulated_s:.3f} s",
                     sim(rh)])
    return _rows(["case (a), NIC : uplink", "fragmented: emulated", "held (the model)", "max-min",
                  "regrouped: emulated", "simulated"], rows)


def sim_sweep_gain(_records: list, results: Path = RESULTS) -> str:
    """Regroup's saving over fixed by oversubscription, job-size mix and load (results/sweep-gain/runs.csv)."""
    from simulator.studies import sweepgain

    path = results / "sweep-gain" / "runs.csv"
    try:
        rows = list(csv.DictReader(io.StringIO(_read(path))))
        return sweepgain.table(sweepgain.gains(rows))
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{path}: not an optirack sweep's runs.csv ({type(e).__name__}: {e})") from None


BLOCKS: dict[str, Callable[[list], str]] = {
    "sim-seeds": sim_seeds, "sim-timeshift": sim_timeshift, "sim-4096": sim_4096,
    "sim-4096-variants": sim_4096_variants, "sim-schedulers": sim_schedulers, "sim-bench": sim_bench,
    "sim-failures": sim_failures, "sim-readme-run": sim_readme_run, "sim-sweep-gain": sim_sweep_gain,
}

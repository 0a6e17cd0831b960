#!/usr/bin/env python3
"""Rebuild every results table of README.md and docs/*.md from the committed records (`make report`).

A table lives between the lines `<!-- report:NAME -->` and `<!-- /report:NAME -->`; this rewrites what is between the
two marks from the records under results/records/ (evidence/records.py) and nothing else. `--check` writes
nothing: it shows a diff of each block whose committed text differs from what the records give, and exits 1
(a unit test runs it). A block of an unknown name, or a mark without its end, exits 2 naming the file and line.

Blocks: headline (README: the paper's two cases, one row per full record and case), cases (the same with the
job of concern and each case's distance from the paper), sweep (case (a) against the uplink's rate), records
(every committed record: when, which commit, fabric, model fingerprint, checks), fidelity-droptail and
shares-droptail (the simulator against the droptail record, as `optirack simulate --case` and
`python -m evidence.uplink` print them). The benchmarks' blocks (reconfig, loopback, step, failover,
checkpoint-cost, placement, store, observed, rack) are in evidence/report/bench.py, from the records under
results/bench/ and results/bench-*.json; the simulator's (sim-*) in evidence/report/sim.py, from results/simulate-*/;
slurm (docs/slurm.md) in evidence/report/slurm.py, from results/slurm/.
Every results table of the README and docs is in a block.

On an emulated GPU the compute is a wait: what the worker reports as utilization is the compute time over the
iteration time. Every block names it so ("compute fraction of an iteration"), beside the paper's measured GPU
utilization.
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from evidence import records as rec
from evidence.report import aggregation as report_aggregation
from evidence.report import bench as report_bench
from evidence.report import failover as report_failover
from evidence.report import neighbours as report_neighbours
from evidence.report import sim as report_sim
from evidence.report import slurm as report_slurm
from evidence.report import trace as report_trace
from evidence.report.bench import ReportError
from simulator.inputs.cases import CASES

ROOT = Path(__file__).resolve().parents[2]

MARK = re.compile(r"^<!-- (/?)report:([A-Za-z0-9_-]+) -->$", re.M)  # a mark is a line of its own
PAPER = {  # Yan et al., OFC 2022, section 3 (as evidence/demo/experiment.py's PAPER)
    "a": {"before_s": 407, "after_s": 109, "reduction": 0.732, "util": "GPU utilization 3×"},
    "b": {"before_s": 368, "after_s": 140, "reduction": 0.620, "util": "no significant change in GPU utilization"},
}
FITTED, PREDICTED = "a", "b"  # the uplink's rate is fitted to case (a); case (b) is a prediction
FRACTION = "compute fraction of an iteration (emulated GPU)"
WIDTH = 105  # prose lines of a block


# --- figures -------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _saving(p: dict) -> str:
    return f"{_pct(p['saving']['median'])} ({p['saving']['spread_pp']:.1f} pp)"


def _fraction(p: dict, ratio: bool = True) -> str:
    f, g = p["fixed"]["mean_gpu_util"], p["regroup"]["mean_gpu_util"]
    return f"{f:.2f} → {g:.2f}" + (f" ({g / f:.1f}×)" if ratio and f > 0 else "")


def _pp(x: float) -> str:
    return f"{report_bench.signed(x)} pp"


def _paper(case: str) -> str:
    p = PAPER[case]
    return f"{p['before_s']} s → {p['after_s']} s, {_pct(p['reduction'])}, {p['util']}"


def full(records: list[rec.Record]) -> list[rec.Record]:
    """The records of a whole demo (both cases, repeated): a quick run or a single case is not a result."""
    return [r for r in records if r.full]


def _label(r: rec.Record) -> str:
    return f"`{r.name}` ({r.data.get('fabric') or 'fabric unrecorded'})"


def _points(r: rec.Record) -> dict[str, dict]:
    return {p["case"]: p for p in r.data["points"]}


# --- blocks --------------------------------------------------------------------------------
def current(records: list[rec.Record]) -> list[rec.Record]:
    """The whole records made with the simulator's current model (so after its commit, on the rack and worker of
    then); all whole records where none is."""
    return rec.of_current_model(records) or full(records)


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def _over(values: list[float], fmt: str, unit: str = "") -> str:
    """The median over records, and their range where there are several: '13.12 s (13.04–13.14)'."""
    med = format(_median(values), fmt) + unit
    if len(values) < 2:
        return med
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return med if lo == hi else f"{med} ({lo}–{hi})"


def _records_label(records: list[rec.Record]) -> str:
    fabrics = sorted({r.data.get("fabric") or "fabric unrecorded" for r in records})
    names = f"`{records[0].name}`" if len(records) == 1 else f"`{records[0].name}` … `{records[-1].name}`"
    return f"{len(records)} ({', '.join(fabrics)}): {names}"


def headline(records: list[rec.Record]) -> str:
    """The README's table: one row per case over the whole records of the current model (each record is a row of
    docs/results.md's cases block): the median over the records of each figure, their range in brackets."""
    fr = full(current(records))
    rows = ["| whole records (fabric) | case | fragmented | regrouped | completion time saved (range over the "
            f"records; largest spread over a record's repeats) | {FRACTION} | paper (completion, saved, measured GPU "
            "utilization) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for case in sorted({c for r in fr for c in _points(r)}):
        ps = [_points(r)[case] for r in fr if case in _points(r)]
        saved = [100 * p["saving"]["median"] for p in ps]
        spread = max(p["saving"]["spread_pp"] for p in ps)
        within = f"{min(saved):.1f}–{max(saved):.1f} %; " if len(saved) > 1 else ""
        f = _median([p["fixed"]["mean_gpu_util"] for p in ps])
        g = _median([p["regroup"]["mean_gpu_util"] for p in ps])
        rows.append(f"| {_records_label(fr)} | ({case}) {CASES[case].label} "
                    f"| {_over([p['fixed']['completion_rack_s'] for p in ps], '.2f', ' s')} "
                    f"| {_over([p['regroup']['completion_rack_s'] for p in ps], '.2f', ' s')} "
                    f"| {_median(saved):.1f} % ({within}spread ≤ {spread:.1f} pp) | {f:.2f} → {g:.2f} ({g / f:.1f}×) "
                    f"| {_paper(case)} |")
    return "\n".join(rows) + "\n\n" + _against_paper(records)


def _against_paper(records: list[rec.Record]) -> str:
    """The sentences that go with the table: the fit's distance, the prediction's miss, the compute fraction."""
    fr = full(current(records))
    if not fr:
        return "No full record (both cases, 3 repeats) is committed."

    def off(case: str) -> list[float]:
        return [100 * (_points(r)[case]["saving"]["median"] - PAPER[case]["reduction"]) for r in fr]

    def span(values: list[float]) -> str:
        lo, hi = _pp(min(values)), _pp(max(values))
        return lo if lo == hi else f"{report_bench.signed(min(values))} to {hi}"

    miss = off(PREDICTED)
    more = " (it saves more than the paper did)" if all(v > 0 for v in miss) else ""
    ratios = [p["regroup"]["mean_gpu_util"] / p["fixed"]["mean_gpu_util"] for r in fr
              for p in [_points(r)[PREDICTED]]]
    rose = f"{min(ratios):.1f}×" if f"{min(ratios):.1f}" == f"{max(ratios):.1f}" else \
        f"{min(ratios):.1f}–{max(ratios):.1f}×"
    each = "the record" if len(fr) == 1 else f"the {len(fr)} records"
    return textwrap.fill(
        f"Across {each}, case ({FITTED}), the case the uplink's rate was fitted to, is {span(off(FITTED))} from the "
        f"paper's {_pct(PAPER[FITTED]['reduction'])}. Case ({PREDICTED}) is a prediction: it is {span(miss)} from "
        f"the paper's {_pct(PAPER[PREDICTED]['reduction'])}, a miss{more}. The compute fraction is compute time "
        f"over iteration time: an emulated GPU computes by waiting out a fixed time, so the fraction rises "
        f"whenever an iteration shortens; in case ({PREDICTED}) it rose {rose} where the paper measured no "
        f"significant change in its GPUs' utilization.", WIDTH)


def fidelity_summary(records: list[rec.Record]) -> str:
    """The README's sentence on the simulator against the current model's records: how many, and the largest
    difference of any point of any of them."""
    from evidence import fidelity as evidence_fidelity
    from simulator.model import fidelity

    checked = rec.of_current_model(records)
    if not checked:
        return "No whole record was made with the simulator's current model yet: nothing checks the model."
    worst = max(abs(p.error) for r in checked for p in evidence_fidelity.check_record(r.data)[0])
    n = "the record" if len(checked) == 1 else f"these {len(checked)} records"
    return textwrap.fill(
        f"The simulator's model of this fabric was committed before {n} were made, and simulates every point of "
        f"each (both cases, the uplink sweep) within {100 * worst:.1f} % of its emulated mean iteration (the test's "
        f"bound is {100 * fidelity.RECORD_TOLERANCE:g} %).", WIDTH)


def cases(records: list[rec.Record]) -> str:
    rows = ["| record (fabric) | case | job of concern | fragmented | regrouped | completion time saved (spread) "
            f"| against the paper | {FRACTION} |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in full(records):
        for case, p in sorted(_points(r).items()):
            c = CASES[case]
            role = "fitted" if case == FITTED else "predicted"
            dist = _pp(100 * (p["saving"]["median"] - PAPER[case]["reduction"]))
            rows.append(f"| {_label(r)} | ({case}) | {'–'.join((c.concern[0], c.concern[-1]))} "
                        f"({len(c.concern)} GPUs) | {p['fixed']['completion_rack_s']:.2f} s "
                        f"| {p['regroup']['completion_rack_s']:.2f} s | {_saving(p)} "
                        f"| {dist} from {_pct(PAPER[case]['reduction'])} ({role}) | {_fraction(p)} |")
    return "\n".join(rows)


def sweep(records: list[rec.Record]) -> str:
    rows = ["| record (fabric) | NIC : uplink | uplink | mean iteration, fragmented | mean iteration, regrouped "
            f"| completion time saved (spread) | {FRACTION} |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in full(records):
        for p in r.data["sweep"]:
            fitted = " (rack file, fitted)" if p["name"].startswith("fitted") else ""
            iterations = r.data["settings"].get("iterations" if fitted else "sweep_iterations")
            rows.append(f"| {_label(r)}, {iterations} iterations | 1:{p['nic_to_uplink']:.3g}{fitted} "
                        f"| {p['uplink_gbps']:.3g} Gbit/s | {p['fixed']['mean_iteration_rack_s']:.3f} s "
                        f"| {p['regroup']['mean_iteration_rack_s']:.3f} s | {_saving(p)} "
                        f"| {_fraction(p, ratio=False)} |")
    return "\n".join(rows)


def records_table(records: list[rec.Record]) -> str:
    rows = ["| record | commit | fabric | what it ran | took | its checks | simulator model |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        d, v = r.data, r.data.get("versions", {})
        s = d["settings"]
        ran = (f"cases {', '.join(sorted(_points(r)))}, {s.get('repeats')} repeats of {s.get('iterations')} "
               f"iterations" + (f", sweep 1:{', 1:'.join(f'{k:g}' for k in s['sweep'])}" if s.get("sweep") else ""))
        c = d.get("checks", {})
        first = (("regroup costs nothing beyond noise", c["regroup_within_noise"]) if "regroup_within_noise" in c
                 else ("signs kept", c.get("signs_kept")))  # records made before the one-sided check
        checks = [first, (f"spread ≤ 10 pp ({c.get('max_spread_pp', 0):.1f})",
                                                         c.get("spread_ok"))]
        if d.get("sweep"):
            checks.append(("sweep monotonic", c.get("sweep_monotonic")))
        if "fabric_clean" in c:
            checks.append(("fabric clean", c["fabric_clean"]))
        if "uplink_shares_maxmin" in c:
            judged = c.get("uplink_flows_judged")
            # a run whose flows were all too short to judge passes the check without showing anything
            checks.append(("uplink shares max-min", "none judged" if judged == 0 else c["uplink_shares_maxmin"]))
        shown = ", ".join(f"{name}: {ok if isinstance(ok, str) else 'yes' if ok else 'NO'}" for name, ok in checks)
        dirty = {True: " (dirty)", False: "", None: ""}[v.get("git_dirty")]
        model = f"`{r.fingerprint[:12]}`" if r.fingerprint else \
            f"unknown (files' hash `{r.model_hash[:12]}`)" if r.model_hash else "unknown (made before model hashes)"
        rows.append(f"| `{r.name}` | {v.get('optirack')}{dirty} | {d.get('fabric') or 'unrecorded'} | {ran} "
                    f"| {d.get('wall_s', 0) / 60:.1f} min | {shown} | {model} |")
    return "\n".join(rows)


def _droptail(records: list[rec.Record]) -> dict:
    found = [r for r in records if r.path.name == rec.DROPTAIL.name]
    if not found:
        raise ReportError(f"{rec.DROPTAIL} is missing")
    return found[0].data


def fidelity_droptail(records: list[rec.Record]) -> str:
    from simulator.model import fidelity

    rows, cal = fidelity.compare(_droptail(records))
    lines = fidelity.table(rows, cal).splitlines()
    return "\n".join(lines[lines.index("") + 1:])  # the table (the prose above it says where it comes from)


def fidelity_current(records: list[rec.Record]) -> str:
    """The simulator against every whole record made with its current model (the fidelity test's check, within
    10 %): one row per point, one column per record, the simulated mean iteration's difference from the emulated."""
    from evidence import fidelity as evidence_fidelity

    checked = rec.of_current_model(records)
    if not checked:
        return "No whole record was made with the current model yet: nothing checks it."
    header = "| point | job of concern | " + " | ".join(f"`{r.name}`" for r in checked) + " |"
    rows = [header, "| --- | --- |" + " --- |" * len(checked)]
    table: dict[tuple[str, str], list[str]] = {}
    for r in checked:
        for p in evidence_fidelity.check_record(r.data)[0]:
            label = re.sub(r"demo rack \(1:[0-9.]+\)", "demo rack", p.label)
            table.setdefault((label, p.policy), []).append(
                f"{p.emulated_s:.3f} → {p.simulated_s:.3f} s ({100 * p.error:+.1f} %)")
    for (label, policy), cells in table.items():
        cells += ["-"] * (len(checked) - len(cells))
        rows.append(f"| {label} | {'fragmented' if policy == 'fixed' else 'regrouped'} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def shares_droptail(records: list[rec.Record]) -> str:
    from evidence import uplink as evidence

    rows = ["| point | emulated | held (the model of the emulation) | max-min (the lossless fabric's what-if) |",
            "| --- | --- | --- | --- |"]
    for s in evidence.shares(_droptail(records)):
        label = re.sub(r", demo rack \((1:[0-9.]+)\)", r", \1", s.held.label).replace("NIC:uplink ", "")
        rows.append(f"| {label} | {100 * s.emulated:.0f} % | {100 * s.held_share:.0f} % ({100 * s.held.error:+.1f} %) "
                    f"| {100 * s.maxmin_share:.0f} % ({100 * s.maxmin.error:+.1f} %) |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[list[rec.Record]], str]] = {
    "headline": headline, "fidelity-summary": fidelity_summary, "cases": cases, "sweep": sweep,
    "records": records_table,
    "fidelity-droptail": fidelity_droptail, "fidelity-current": fidelity_current, "shares-droptail": shares_droptail,
    **report_bench.BLOCKS, **report_sim.BLOCKS, **report_trace.BLOCKS, **report_neighbours.BLOCKS,
    **report_slurm.BLOCKS, **report_failover.BLOCKS, **report_aggregation.BLOCKS,
}


# --- files ---------------------------------------------------------------------------------
def render(text: str, where: str, records: list[rec.Record], cache: dict[str, str] | None = None) -> str:
    """`text` with every block between its marks rebuilt; ReportError names a bad mark by file and line. `cache`:
    blocks already rendered from these records, by name (filled here)."""
    out, pos, cache = [], 0, {} if cache is None else cache
    marks = list(MARK.finditer(text))
    i = 0
    while i < len(marks):
        m = marks[i]
        line = text.count("\n", 0, m.start()) + 1
        closing, name = m.group(1) == "/", m.group(2)
        if closing:
            raise ReportError(f"{where}:{line}: <!-- /report:{name} --> without its opening mark")
        if name not in BLOCKS:
            raise ReportError(f"{where}:{line}: unknown block report:{name} (blocks: {', '.join(BLOCKS)})")
        if i + 1 >= len(marks) or marks[i + 1].group(1) != "/" or marks[i + 1].group(2) != name:
            raise ReportError(f"{where}:{line}: report:{name} has no <!-- /report:{name} --> after it")
        end = marks[i + 1]
        if name not in cache:
            cache[name] = BLOCKS[name](records).rstrip("\n")
        out += [text[pos:m.end()], "\n", cache[name], "\n"]
        pos = end.start()
        i += 2
    out.append(text[pos:])
    return "".join(out)


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def run(check: bool, root: Path = ROOT, directory: Path | None = None, out=sys.stdout,
        cache: dict[str, str] | None = None) -> int:
    """Rebuild (or with `check`, compare) every document's blocks; `cache` as render's, shared by all documents."""
    records = rec.load(directory or rec.RECORDS)
    cache = {} if cache is None else cache
    differs = []
    for path in documents(root):
        text = path.read_text()
        if not MARK.search(text):
            continue
        where = str(path.relative_to(root))
        new = render(text, where, records, cache)
        if new == text:
            continue
        differs.append(where)
        if check:
            out.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                f"{where} (committed)", f"{where} (from the records)"))
        else:
            path.write_text(new)
            print(f"rebuilt {where}", file=out)
    if check and differs:
        print(f"\n{len(differs)} file(s) differ from the records: {', '.join(differs)}; run make report", file=out)
        return 1
    if not differs:
        print("every report block is what the records give", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="write nothing; show a diff and exit 1 where a block differs from the records")
    args = p.parse_args(argv)
    try:
        return run(args.check, root=ROOT)
    except (ReportError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

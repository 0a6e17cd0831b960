"""make report's blocks from the benchmarks' committed records (results/bench/<UTC time>-<commit>-<benchmark>.json,
written by a benchmark's --json) and the other benchmark records under results/ (scripts/report.py merges BLOCKS).

A block is a function of the demo records (unused here) that returns the block's text; it reads every committed
record of its benchmark, oldest first, one row per record (or per record and row), so a new run adds a row and
never changes an old one.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ReportError(Exception):
    pass


BENCH = ROOT / "results" / "bench"


def bench_records(name: str, directory: Path | None = None) -> list[tuple[str, dict]]:
    """(stem, record) of every committed record of benchmark `name`, oldest first."""
    out = []
    for path in sorted((directory or BENCH).glob(f"*-{name}.json")):
        try:
            out.append((path.stem.removesuffix(f"-{name}"), json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError) as e:
            raise ReportError(f"{path}: cannot read the record: {e}") from None
    return out


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _mmm(lo: float, mid: float, hi: float) -> str:
    return f"{mid:.1f} ({lo:.1f}–{hi:.1f}) ms"


def reconfig(_records: list) -> str:
    rows = ["| record | rack | OCS ports | change | end to end: REST request → forwarding confirmed "
            "| less the switching time | the event's overhead (from its start) | before the event starts "
            "| switch programming | of it inside the dark window |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for stem, data in bench_records("bench_reconfig"):
        for r in data["results"]:
            if "e2e_median_ms" not in r:
                continue
            e2e = _mmm(r["e2e_min_ms"], r["e2e_median_ms"], r["e2e_max_ms"])
            rows.append(f"| `{stem}` | {r['gpus']} GPUs{' (bare)' if r.get('bare') else ''} | {r['ports']:,} "
                        f"| {r['circuits']} circuit{_s(r['circuits'])} | {e2e} "
                        f"| {r['e2e_overhead_median_ms']:.1f} ms | {_mmm(r['min_ms'], r['median_ms'], r['max_ms'])} "
                        f"| {r['before_event_ms_median']:.1f} ms | {r['programming_ms_median']:.1f} ms "
                        f"| {r['programming_in_dark_ms_median']:.1f} ms |")
    return "\n".join(rows)


def loopback(_records: list) -> str:
    rows = ["| record | ring | rounds × iterations | per all-reduce, median (min–max) over the rounds "
            "| per step | the model's constant (per step) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for stem, data in bench_records("bench_loopback"):
        r, cmd = data["results"], data["command"]
        rounds = r["allreduce_ms"]["n"]
        iterations = cmd[cmd.index("--iterations") + 1] if "--iterations" in cmd else "40"
        a, s = r["allreduce_ms"], r["step_ms"]
        rows.append(f"| `{stem}` | {r['ranks']} ranks, {r['steps']} steps, {r['gradient_bytes']} B "
                    f"| {rounds} × {iterations} | {_mmm(a['min'], a['median'], a['max'])} "
                    f"| {_mmm(s['min'], s['median'], s['max'])} | {r['model_step_ms']:.2f} ms |")
    return "\n".join(rows)


def step(_records: list) -> str:
    """bench_allreduce's cost of a ring step beyond its bytes: at the paper cases' gradient (the model's STEP_S) and
    for a tiny one (what is left of it without bytes)."""
    from simulator.calibration import STEP_RECORD, STEP_S

    rows = ["| record | ring | gradient | iterations | % of the bound, median (min–max) | per step beyond the bound "
            "| per all-reduce | the model's constant (per step) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("bench_allreduce-vgg16-chunk", "bench_allreduce-tiny"):
        for stem, data in bench_records(name):
            r = data["results"]
            b, f = r["step_beyond_bound_ms"], r["percent_of_bound"]
            used = f"{1000 * STEP_S:.2f} ms" if f"{stem}-{name}.json" in STEP_RECORD else "-"
            rows.append(f"| `{stem}-{name.removeprefix('bench_allreduce-')}` | {len(r['ring'])} ranks, {r['steps']} "
                        f"steps | {r['gradient_bytes']:,} B | {b['n']} | {f['median']:.1f} ({f['min']:.1f}–"
                        f"{f['max']:.1f}) % | {_mmm(b['min'], b['median'], b['max'])} "
                        f"| {r['steps'] * b['median']:.1f} ms | {used} |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[list], str]] = {"reconfig": reconfig, "loopback": loopback, "step": step}

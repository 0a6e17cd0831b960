"""make report's fail-over blocks: the recovery's records (scripts/bench_failover.py, results/failover/), one column
per fault, and the three faults on the 16-GPU rack of two models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evidence.report.bench import RESULTS, ReportError, _field, _record
from scripts.stats import percentile

PHASES = (  # (key in a round, what the phase is): from the kill, in order
    ("detection_s", "detection (the job `recovering`)"),
    ("planning_s", "planning (a sure sign, the lost workers stopped, spares chosen)"),
    ("ocs_s", "OCS change (circuits and flows confirmed)"),
    ("containers_s", "hand-over (survivors and the warm spare told their ranks; else a container started)"),
    ("restore_s", "state fetch (each rank's checkpoint: its own memory, a peer's, or a disk)"),
    ("rendezvous_s", "rendezvous (until every rank began its first iteration)"),
)
# the records of the rebuilt recovery (controller/jobs/: one loop), one per fault, 20 rounds each; the fault's column
FAILOVER = {"server": "failover/server.json", "worker": "failover/worker.json", "cascade": "failover/cascade.json",
            "hang": "failover/hang.json", "restart": "failover/restart.json"}
COLUMNS = {"server": "a server killed", "worker": "a worker killed (`kill -9`)",
           "cascade": "a cascade (workers, then daemons)", "hang": "a server hung", "restart": "the controller killed"}


def _failover_rounds(names: dict[str, str], directory: Path | None) -> dict[str, list[dict]]:
    rounds = {}
    for fault, name in names.items():
        path = (directory or RESULTS) / name
        rounds[fault] = _field(path, _record(path), "results", "rounds")
        if not rounds[fault]:
            raise ReportError(f"{path}: the record has no rounds")
    return rounds


def _failover_cell(rounds: list[dict], key: str, bold: bool = False) -> str:
    """p50 / the worst of the rounds that recovered; a round that did not (bench_failover keeps it, with "failed") has
    no phases, and from the fault to every rank iterating it counts as never: its worst is then not reached."""
    xs = [r[key] for r in rounds if "failed" not in r and key in r]
    failed = len(rounds) - len([r for r in rounds if "failed" not in r])
    if not xs:
        return "–"
    mid = percentile(xs, 50)
    top = f"{max(xs):.2f} s" if not (failed and key == "total_s") else f"not reached ({failed} of {len(rounds)})"
    return f"{f'**{mid:.2f}**' if bold else f'{mid:.2f}'} / {top}"


def failover(_records: list, directory: Path | None = None) -> str:
    """From the fault to every rank iterating again, per phase: p50 / the worst round, one column per fault; from the
    controller back (the restart fault); the rounds done, the iterations redone, the plans made again."""
    rounds = _failover_rounds(FAILOVER, directory)
    n = {f: len(rs) for f, rs in rounds.items()}
    rows = [f"| from the fault: p50 / max of the rounds ({', '.join(sorted({str(v) for v in n.values()}))} each) | "
            + " | ".join(COLUMNS[f] for f in FAILOVER) + " |", "| --- |" + " --- |" * len(FAILOVER)]
    for key, what in PHASES:
        rows.append(f"| {what} | " + " | ".join(_failover_cell(rounds[f], key) for f in FAILOVER) + " |")
    rows.append("| **all ranks iterating again** | " + " | ".join(_failover_cell(rounds[f], "total_s", True)
                                                                   for f in FAILOVER) + " |")
    rows.append("| from the controller back to every rank iterating | " + " | ".join(
        _failover_cell(rounds[f], "back_s") for f in FAILOVER) + " |")
    rows.append("| rounds that ended `done` after one recovery | " + " | ".join(
        f"{sum(r.get('state') == 'done' and r.get('recoveries') == 1 for r in rounds[f])} of {n[f]}"
        for f in FAILOVER) + " |")
    rows.append("| iterations redone: p50 / max | " + " | ".join(
        f"{percentile([r.get('iterations_redone', 0) for r in rounds[f]], 50):g} / "
        f"{max(r.get('iterations_redone', 0) for r in rounds[f])}" for f in FAILOVER) + " |")
    rows.append("| rounds whose recovery planned again (a loss met mid-way) | " + " | ".join(
        f"{sum(1 for r in rounds[f] if r.get('replans'))} of {n[f]}" for f in FAILOVER) + " |")
    woke = [r["woke"] for r in rounds["hang"] if "woke" in r]
    swept = [w["swept_s"] for w in woke]
    hang = (f"{percentile(swept, 50):.2f} / {max(swept):.2f} s; {sum(w['recorded_after_wake'] for w in woke)}"
            if woke else "–")
    rows.append("| the hung server woken: swept and up (p50 / max); its workers' lines recorded after it woke | "
                + " | ".join(hang if f == "hang" else "–" for f in FAILOVER) + " |")
    return "\n".join(rows)


TRACE16 = {"cascade": "failover/trace16-cascade.json", "hang": "failover/trace16-hang.json",
           "restart": "failover/trace16-restart.json"}


def failover_trace16(_records: list, directory: Path | None = None) -> str:
    """The three faults on the 16-GPU rack of two models: per fault the rounds, how each ended and under how many
    switches, the GPUs swapped, from the fault (and from the controller back) to every rank iterating."""
    rounds = _failover_rounds(TRACE16, directory)
    rows = ["| fault | rounds `done` under one switch | swapped (lost -> spare) | every rank iterating again "
            "from the fault: p50 / max | from the controller back: p50 / max |", "| --- | --- | --- | --- | --- |"]
    for fault, rs in rounds.items():
        one = sum(1 for r in rs if r.get("state") == "done" and len(r.get("switches_after", [])) == 1)
        swaps = sorted({", ".join(f"{a} -> {b}" for a, b in sorted(r.get("spares", {}).items())) for r in rs})
        rows.append(f"| {COLUMNS[fault]} | {one} of {len(rs)} | {'; '.join(swaps) or '–'} "
                    f"| {_failover_cell(rs, 'total_s')} | {_failover_cell(rs, 'back_s')} |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[list], str]] = {"failover": failover, "failover-trace16": failover_trace16}

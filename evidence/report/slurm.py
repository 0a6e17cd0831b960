"""The block of docs/slurm.md (engine.py merges BLOCKS): what scripts/slurm_experiment.py measured through
Slurm, from the records under results/slurm/ (one row per record)."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from evidence.report.bench import ReportError

SLURM = Path(__file__).resolve().parents[2] / "results" / "slurm"


def _records(directory: Path | None) -> list[tuple[str, dict]]:
    found = [(p.stem, json.loads(p.read_text())) for p in sorted((directory or SLURM).glob("*.json"))]
    if not found:
        raise ReportError(f"no committed record under {directory or SLURM} (python -m scripts.slurm_experiment)")
    return found


def slurm(_records_unused: list, directory: Path | None = None) -> str:
    """Case (a) through sbatch (fragmented without optirack's hooks, regrouped with them), and the topology mix."""
    rows = ["| record | case (a) through `sbatch`: fragmented → regrouped (median of repeats, rack s) | saved | "
            "mix of sbatch jobs: circuit changes, circuits, dark s — without topology.conf | — with it |",
            "| --- | --- | --- | --- | --- |"]
    for stem, r in _records(directory):
        case = r.get("case_a")
        if case:
            s = case["summary"]
            fig = f"{s['fragmented_s']:.2f} s → {s['regrouped_s']:.2f} s ({case['repeats']} repeats)"
            saved = f"{100 * s['saved']:.1f} % (paper: 73.2 %)"
        else:
            fig = saved = "-"
        mix = {m["topology"]: m for m in (r.get("topology_mix") or {}).get("runs", [])}

        def cell(m):
            return f"{m['regroups']}, {m['circuit_changes']}, {m['dark_window_s']:.3f} s" if m else "-"

        rows.append(f"| `{stem}` | {fig} | {saved} | {cell(mix.get(False))} | {cell(mix.get(True))} |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[list], str]] = {"slurm": slurm}

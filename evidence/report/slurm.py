"""The blocks of docs/slurm.md (engine.py merges BLOCKS): what scripts/slurm_experiment.py measured through
Slurm, from the records under results/slurm/ (one row per record that holds the block's part)."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from evidence.report.bench import ReportError

SLURM = Path(__file__).resolve().parents[2] / "results" / "slurm"


def _records(directory: Path | None, *parts: str) -> list[tuple[str, dict]]:
    """The records holding any of `parts` (an error naming the directory and the option when none does)."""
    found = [(p.stem, json.loads(p.read_text())) for p in sorted((directory or SLURM).glob("*.json"))]
    found = [(stem, r) for stem, r in found if any(r.get(k) for k in parts)]
    if not found:
        opts = " or ".join("--" + k.replace("_", "-").replace("case-a", "case a") for k in parts)
        raise ReportError(f"no committed record under {directory or SLURM} with {', '.join(parts)} "
                          f"(python -m scripts.slurm_experiment {opts})")
    return found


def slurm(_records_unused: list, directory: Path | None = None) -> str:
    """Case (a) through sbatch (fragmented without optirack's hooks, regrouped with them), and the topology mix."""
    rows = ["| record | case (a) through `sbatch`: fragmented → regrouped (median of repeats, rack s) | saved | "
            "mix of sbatch jobs: circuit changes, circuits, dark s — without topology.conf | — with it |",
            "| --- | --- | --- | --- | --- |"]
    for stem, r in _records(directory, "case_a", "topology_mix"):
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


def _range(values: list[float], fmt: str = "{:.2f} s") -> str:
    vs = sorted(values)
    mid = vs[len(vs) // 2] if len(vs) % 2 else (vs[len(vs) // 2 - 1] + vs[len(vs) // 2]) / 2
    return fmt.format(mid) + (f" ({fmt.format(vs[0])}–{fmt.format(vs[-1])})" if len(vs) > 1 else "")


def failover(_records_unused: list, directory: Path | None = None) -> str:
    """A node lost under a --requeue job: with optirack telling Slurm at once, and with Slurm alone."""
    rows = ["| record | who tells Slurm | rounds | server's death → job requeued | → running again | "
            "→ iterating again | iterations lost (checkpoint every) | ended |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for stem, r in _records(directory, "failover"):
        f = r["failover"]
        for arm, who in (("optirack", "optirack, at once"), ("slurm alone", f"Slurm alone (SlurmdTimeout "
                                                                             f"{f['slurmd_timeout_s']} s)")):
            mine = [x for x in f["rounds"] if x["arm"] == arm]
            if not mine:
                continue
            ended = ", ".join(sorted({x["final"] for x in mine}))
            lost = _range([x["iterations_lost"] for x in mine], "{:g}")
            rows.append(f"| `{stem}` | {who} | {len(mine)} | {_range([x['requeued_s'] for x in mine])} | "
                        f"{_range([x['started_again_s'] for x in mine])} | "
                        f"{_range([x['iterating_again_s'] for x in mine])} | {lost} ({mine[0]['checkpoint_every']}) "
                        f"| {ended} |")
    held = ", ".join(sorted({f"{r['failover']['cred_expire_s']} s" for _, r in _records(directory, "failover")}))
    return "\n".join(rows) + ("\n\nMedians over the rounds, their range in brackets; seconds after the server's "
                              f"death. Both arms hold the requeued job for cred_expire ({held}) before it may start "
                              "again.")


def prolog(_records_unused: list, directory: Path | None = None) -> str:
    """What the PrologSlurmctld adds to a job's start, slurmctld's answers meanwhile, and the reloads."""
    rows = ["| record | jobs | prolog: p50 | p99 | max | `squeue` answer: p50 | max | max during a reload "
            "(answers) | reloads (`scontrol reconfigure`) | circuit changes that left the tree | most in flight |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for stem, r in _records(directory, "prolog_cost"):
        s = r["prolog_cost"]["summary"]
        during = (f"{s['squeue_during_reload_max_s']:.3f} s ({s['squeue_during_reload']})"
                  if s["squeue_during_reload_max_s"] is not None else "- (0)")
        rows.append(f"| `{stem}` | {s['prologs']} of {s['jobs']} | {s['prolog_p50_s']:.3f} s | "
                    f"{s['prolog_p99_s']:.3f} s | {s['prolog_max_s']:.3f} s | {s['squeue_p50_s']:.3f} s | "
                    f"{s['squeue_max_s']:.3f} s | "
                    f"{during} | {s['reconfigures']} (failed {s['failed']}) | {s['unchanged']} | "
                    f"{s['most_in_flight']} |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[list], str]] = {"slurm": slurm, "slurm-failover": failover, "slurm-prolog": prolog}

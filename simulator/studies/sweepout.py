"""What `optirack sweep` (simulator/studies/sweep.py) writes for a study: the figures it tabulates, `runs.csv` and
`study.csv`, `study.json`, the `study.md` table (each cell the mean over the seeds with the half-width of its 95 %
interval) and the plots of each figure against the load.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

FIGURES = {  # name in the table -> (summary key, sub key, label)
    "jct_mean_s": ("jct_s", "mean", "JCT mean (s)"),
    "jct_p95_s": ("jct_s", "p95", "JCT p95 (s)"),
    "queue_mean_s": ("queue_s", "mean", "queueing mean (s)"),
    "slowdown_mean": ("slowdown", "mean", "slowdown mean"),
    "steady_held": ("steady", "held", "steady GPUs held"),
    "steady_computing": ("steady", "computing", "steady GPUs computing"),
    "makespan_s": ("makespan_s", None, "makespan (s)"),
    "goodput": ("goodput", None, "goodput"),
}
PERCENT = ("steady_held", "steady_computing", "goodput")


def _fmt(x: float, pct: bool) -> str:
    if x != x:
        return "-"
    return f"{100 * x:.1f} %" if pct else f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"


def markdown(table: list[dict], meta: dict) -> str:
    axes = [k for k in ("oversubscription", "mix") if len({r.get(k) for r in table}) > 1]  # shown where they vary
    lines = [f"# optirack sweep: {meta['tasks']} runs", "", meta["description"], "",
             "Each cell: the mean over the seeds ± the half-width of its 95 % interval (Student's t).", "",
             "| run | " + "".join(f"{k} | " for k in axes) + "load | "
             + " | ".join(label for _, _, label in FIGURES.values()) + " |",
             "| --- | --- |" + " --- |" * (len(FIGURES) + len(axes))]
    for r in table:
        cells = []
        for name in FIGURES:
            pct = name in PERCENT
            cells.append(f"{_fmt(r[name], pct)} ± {_fmt(r[name + '_ci95'], pct)}")
        lines.append(f"| {r['run']} | " + "".join(f"{r[k]:g} | " if isinstance(r[k], float) else f"{r[k]} | "
                                                  for k in axes) + f"{r['load']:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plots(out: Path, table: list[dict]) -> list[Path]:
    """Each figure against the load, one line per run, the 95 % intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    runs = list(dict.fromkeys(r["run"] for r in table))
    shown = ["jct_mean_s", "slowdown_mean", "queue_mean_s", "steady_computing"]
    if any(r["failures"] != "none" for r in table):
        shown.append("goodput")
    for name in shown:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for run in runs:
            rs = sorted((r for r in table if r["run"] == run), key=lambda r: r["load"])
            err = [0.0 if r[name + "_ci95"] != r[name + "_ci95"] else r[name + "_ci95"] for r in rs]
            ax.errorbar([r["load"] for r in rs], [r[name] for r in rs], yerr=err, capsize=3, marker="o", label=run)
        ax.set_xlabel("offered load")
        ax.set_ylabel(FIGURES[name][2])
        ax.set_title(f"{FIGURES[name][2]} by load (mean, 95 % interval over seeds)")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        path = out / f"sweep-{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        files.append(path)
    return files


def write(out: Path, rows: list[dict], table: list[dict], meta: dict, with_plots: bool = True) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name, data in (("runs.csv", rows), ("study.csv", table)):
        path = out / name
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(data[0]))
            w.writeheader()
            w.writerows(data)
        files.append(path)
    (out / "study.json").write_text(json.dumps({**meta, "study": table}, indent=1))
    (out / "study.md").write_text(markdown(table, meta))
    files += [out / "study.json", out / "study.md"]
    if with_plots:
        files += plots(out, table)
    return files

"""Where regrouping pays: regroup's saving of mean job completion time over fixed, from an `optirack sweep` over
uplink oversubscription (`--oversubscriptions`), job-size mix (`--mixes`) and load (`--loads`), per seed paired
(the same synthetic jobs under both policies).

    python -m simulator.studies.sweepgain SWEEP_FOLDER --png FIGURE.png

reads the sweep's runs.csv and prints the table (mean saving over the seeds, and the smallest and largest seed's);
`--png` draws it as one figure, a panel per load, a line per mix against the oversubscription. `make report`'s
block sim-sweep-gain renders the same table (evidence/report/sim.py).
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

MIX_ORDER = ("small", "field", "large")


def gains(rows: list[dict]) -> list[dict]:
    """Per (load, mix, oversubscription): regroup's saving 1 - JCT mean(regroup) / JCT mean(fixed), each seed
    paired with its own fixed run; mean, min and max over the seeds."""
    runs: dict[tuple, dict[str, float]] = {}
    for r in rows:
        key = (float(r["load"]), r.get("mix") or "field", float(r["oversubscription"]), int(r["seed"]))
        runs.setdefault(key, {})[r["policy"]] = float(r["jct_mean_s"])
    cells: dict[tuple, list[float]] = {}
    for (load, mix, over, _seed), by in runs.items():
        if "fixed" in by and "regroup" in by:
            cells.setdefault((load, mix, over), []).append(1 - by["regroup"] / by["fixed"])
    if not cells:
        raise ValueError("no seed ran both fixed and regroup")

    def order(k: tuple) -> tuple:
        return (k[0], MIX_ORDER.index(k[1]) if k[1] in MIX_ORDER else len(MIX_ORDER), k[1], k[2])

    return [{"load": k[0], "mix": k[1], "oversubscription": k[2], "seeds": len(v), "saving": statistics.mean(v),
             "min": min(v), "max": max(v)} for k, v in sorted(cells.items(), key=lambda kv: order(kv[0]))]


def read_runs(folder: Path) -> list[dict]:
    with (folder / "runs.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def table(g: list[dict]) -> str:
    overs = sorted({x["oversubscription"] for x in g})
    head = "| load | job sizes | " + " | ".join(f"{o:g}:1" for o in overs) + " |"
    lines = [head, "| --- | --- |" + " --- |" * len(overs)]
    for load, mix in dict.fromkeys((x["load"], x["mix"]) for x in g):
        cell = {x["oversubscription"]: x for x in g if x["load"] == load and x["mix"] == mix}
        lines.append(f"| {load:g} | {mix} | " + " | ".join(
            f"{100 * cell[o]['saving']:+.1f} % ({100 * cell[o]['min']:+.1f} to {100 * cell[o]['max']:+.1f})"
            if o in cell else "-" for o in overs) + " |")
    return "\n".join(lines)


def figure(g: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted({x["load"] for x in g})
    fig, axes = plt.subplots(1, len(loads), figsize=(4.2 * len(loads), 3.6), sharey=True, squeeze=False)
    for ax, load in zip(axes[0], loads, strict=True):
        for mix in dict.fromkeys(x["mix"] for x in g):
            xs = sorted((x for x in g if x["load"] == load and x["mix"] == mix), key=lambda x: x["oversubscription"])
            err = [[100 * (x["saving"] - x["min"]) for x in xs], [100 * (x["max"] - x["saving"]) for x in xs]]
            ax.errorbar([x["oversubscription"] for x in xs], [100 * x["saving"] for x in xs], yerr=err,
                        marker="o", capsize=3, label=mix)
        ax.set_xscale("log", base=2)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(f"offered load {load:g}")
        ax.set_xlabel("uplink oversubscription (switch's NICs : its uplinks)")
    axes[0][0].set_ylabel("regroup's saving of mean JCT over fixed (%)")
    axes[0][-1].legend(title="job sizes", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulator.studies.sweepgain", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path, help="an optirack sweep --out folder (its runs.csv)")
    ap.add_argument("--png", type=Path, help="draw the figure here")
    args = ap.parse_args(argv)
    try:
        g = gains(read_runs(args.sweep))
    except (OSError, KeyError, ValueError) as e:
        print(f"sweepgain: {args.sweep}: {e}", file=sys.stderr)
        return 2
    print(table(g))
    if args.png:
        print(f"wrote {figure(g, args.png)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

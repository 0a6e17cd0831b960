"""PNG plots of a simulated study: completion times, queueing, utilization over time (matplotlib, Agg)."""
from __future__ import annotations

from pathlib import Path

COLORS = {"fixed": "#c0392b", "regroup": "#2471a3", "defrag": "#1e8449", "timeshift": "#b9770e", "ideal": "#555555",
          "static": "#8e44ad", "oddl": "#16a085", "panama": "#d35400", "switchml": "#a04000", "topoopt": "#117a65",
          "sipml": "#2e4053"}


def _color(name: str) -> str:
    """A run's colour: its policy's, also for policy+scheduler or policy+recovery runs; grey for any other."""
    return COLORS.get(name) or COLORS.get(name.split("+")[0]) or "#7f8c8d"


def _groups(record: dict, values) -> list[tuple[list[str], object]]:
    """Policies whose curves are equal, drawn once and labelled together ('regroup = defrag')."""
    groups: list[tuple[list[str], object]] = []
    for name, p in record["policies"].items():
        v = values(p)
        for names, w in groups:
            if w == v:
                names.append(name)
                break
        else:
            groups.append(([name], v))
    return groups


def _legend(ax) -> None:
    """Beside the axes, never over the data."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _label(names: list[str]) -> str:
    return " = ".join(names) + (" (equal)" if len(names) > 1 else "")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, record: dict, key: str, xlabel: str) -> None:
    base = record.get("baseline")
    for names, values in _groups(record, lambda p: _values(p, key)):
        if not values:
            continue
        if "jobs" in record["policies"][names[0]]:
            ys = [(i + 1) / len(values) for i in range(len(values))]
        else:  # quantiles at 0, 1/n, ..., 1
            ys = [i / (len(values) - 1) if len(values) > 1 else 1.0 for i in range(len(values))]
        mean = record["policies"][names[0]]["summary"][key]["mean"]
        vs = ""
        if base and base not in names:
            bm = record["policies"][base]["summary"][key]["mean"]
            vs = f", mean {100 * (mean - bm) / bm:+.1f} % vs {base}" if bm else ""
        ax.step(values, ys, where="post", color=COLORS.get(names[0]), label=_label(names) + vs, linewidth=1.5)
    ax.set_xscale("symlog", linthresh=1.0)  # linear below a second (no wait at 0), logarithmic above
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.grid(alpha=0.3)
    _legend(ax)


def _values(p: dict, key: str) -> list[float]:
    """A policy's values of `key` sorted: every job's, or the quantiles kept for large runs."""
    if "jobs" in p:
        return sorted(max(row[key], 0.0) for row in p["jobs"] if not row.get("failed"))
    return p.get("cdf", {}).get(key, [])


def _utilization(ax, record: dict) -> None:
    for names, u in _groups(record, lambda p: p["utilization"]):
        steady = record["policies"][names[0]]["summary"]["steady"]
        tag = f" (steady {100 * steady['computing']:.1f} %)" if steady["computing"] == steady["computing"] else ""
        ax.plot(u["t_s"], [100 * x for x in u["computing"]], color=COLORS.get(names[0]), linewidth=1.4,
                label=f"{_label(names)}: computing{tag}")
        ax.plot(u["t_s"], [100 * x for x in u["held"]], color=COLORS.get(names[0]), linewidth=0.8, linestyle=":",
                label=f"{_label(names)}: held")
    steady = next(iter(record["policies"].values()))["summary"]["steady"]
    if steady["to_s"] > steady["from_s"]:
        ax.axvspan(steady["from_s"], steady["to_s"], color="#999999", alpha=0.12, label="steady-state window")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("cluster GPUs (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    _legend(ax)


def _fragmentation(ax, record: dict) -> None:
    for names, f in _groups(record, lambda p: p.get("fragmentation") or {}):
        if f:
            ax.step(f["t_s"], f["largest_one_switch"], where="post", color=COLORS.get(names[0]), linewidth=1.2,
                    label=f"{_label(names)}: mean {f['mean_largest']:.1f} GPUs")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("largest job one switch could take now (free GPUs under it)")
    ax.grid(alpha=0.3)
    _legend(ax)


def _bars(ax, record: dict) -> None:
    names = list(record["policies"])
    means = [record["policies"][n]["summary"]["jct_s"]["mean"] for n in names]
    queue = [record["policies"][n]["summary"]["queue_s"]["mean"] for n in names]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], means, 0.4, color=[_color(n) for n in names], label="mean JCT")
    ax.bar([x + 0.2 for x in xs], queue, 0.4, color=[_color(n) for n in names], alpha=0.45, hatch="//",
           label="mean queueing delay")
    base = record.get("baseline")
    for x, n in zip(xs, names, strict=True):
        s = record["policies"][n]["summary"]
        change = record["policies"][n].get("against_baseline", {}).get("jct_s.mean", float("nan"))
        vs = "baseline" if n == base else f"{change:+.1f} % JCT\\nvs {base}" if change == change else ""
        ax.annotate(f"{vs}\n{s['circuits_changed']:,} circuits\n{s['dark_s']:.1f} s dark", (x, max(means) * 1.02),
                    ha="center", fontsize=6)
    many = len(names) > 5  # the neighbours beside ours: slanted names, so they do not overlap
    ax.set_xticks(list(xs), names, rotation=30 if many else 0, ha="right" if many else "center")
    ax.set_ylabel("seconds")
    ax.set_ylim(0, max(means) * 1.45 if means else 1)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3, axis="y")


def write(out: Path, record: dict) -> list[Path]:
    plt = _plt()
    files = []
    title = record["rack"]["summary"] + "\n" + record["workload"]["description"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 8.5))
    _cdf(axes[0][0], record, "jct_s", "job completion time (s, log)")
    _cdf(axes[0][1], record, "queue_s", "queueing delay (s, log above 1 s)")
    _utilization(axes[1][0], record)
    _bars(axes[1][1], record)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    files.append(out / "overview.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    for name, draw in (("jct-cdf.png", lambda ax: _cdf(ax, record, "jct_s", "job completion time (s, log)")),
                       ("queueing-cdf.png", lambda ax: _cdf(ax, record, "queue_s", "queueing delay (s, log)")),
                       ("utilization.png", lambda ax: _utilization(ax, record)),
                       ("fragmentation.png", lambda ax: _fragmentation(ax, record))):
        fig, ax = plt.subplots(figsize=(9, 4.5))
        draw(ax)
        ax.set_title(title, fontsize=8)
        fig.tight_layout()
        files.append(out / name)
        fig.savefig(files[-1], dpi=100)
        plt.close(fig)
    return files

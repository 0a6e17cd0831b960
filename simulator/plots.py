"""PNG plots of a simulated study: completion times, queueing, utilization over time (matplotlib, Agg)."""
from __future__ import annotations

from pathlib import Path

COLORS = {"fixed": "#c0392b", "regroup": "#2471a3", "defrag": "#1e8449", "timeshift": "#b9770e"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, record: dict, key: str, xlabel: str) -> None:
    for name, p in record["policies"].items():
        values = sorted(max(row[key], 0.0) for row in p["jobs"] if not row.get("failed"))
        ys = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, ys, where="post", color=COLORS.get(name), label=p["label"], linewidth=1.5)
    ax.set_xscale("symlog", linthresh=1.0)  # linear below a second (no wait at 0), logarithmic above
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _utilization(ax, record: dict) -> None:
    for name, p in record["policies"].items():
        u = p["utilization"]
        ax.plot(u["t_s"], [100 * x for x in u["computing"]], color=COLORS.get(name), linewidth=1.4,
                label=f"{name}: computing")
        ax.plot(u["t_s"], [100 * x for x in u["held"]], color=COLORS.get(name), linewidth=0.8, linestyle=":",
                label=f"{name}: held")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("cluster GPUs (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper right", ncol=2)


def _bars(ax, record: dict) -> None:
    names = list(record["policies"])
    means = [record["policies"][n]["summary"]["jct_s"]["mean"] for n in names]
    queue = [record["policies"][n]["summary"]["queue_s"]["mean"] for n in names]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], means, 0.4, color=[COLORS.get(n) for n in names], label="mean JCT")
    ax.bar([x + 0.2 for x in xs], queue, 0.4, color=[COLORS.get(n) for n in names], alpha=0.45, hatch="//",
           label="mean queueing delay")
    for x, n in zip(xs, names, strict=True):
        s = record["policies"][n]["summary"]
        ax.annotate(f"{s['circuits_changed']:,} circuits\n{s['dark_s']:.1f} s dark", (x, max(means) * 1.02),
                    ha="center", fontsize=6)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("seconds")
    ax.set_ylim(0, max(means) * 1.25 if means else 1)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, axis="y")


def write(out: Path, record: dict) -> list[Path]:
    plt = _plt()
    files = []
    title = record["rack"]["summary"] + "\n" + record["workload"]["description"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
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
                       ("utilization.png", lambda ax: _utilization(ax, record))):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax)
        ax.set_title(title, fontsize=8)
        fig.tight_layout()
        files.append(out / name)
        fig.savefig(files[-1], dpi=100)
        plt.close(fig)
    return files

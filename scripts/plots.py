"""Figures like the paper's Fig. 3: NIC throughput, and the compute fraction of each iteration (what an emulated
GPU's "utilization" is: its compute is a wait), before and after."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = ["#c0392b", "#2471a3", "#1e8449", "#b9770e", "#7d3c98", "#17a589"]


def _scale(record: dict) -> tuple[float, float]:
    emu = record["rack"].get("emulation", {})
    return emu.get("rate_scale", 1.0), emu.get("time_dilation", 1.0)


def _throughput(ax, job: dict, rate_scale: float, dilation: float, t0: float) -> None:
    for i, (gpu, samples) in enumerate(sorted(job.get("throughput", {}).items())):
        if not samples:
            continue
        t = [(s["t"] - t0) / dilation for s in samples]
        gbps = [(s["tx_bps"] + s["rx_bps"]) / rate_scale / 1e9 for s in samples]
        color = COLORS[i % len(COLORS)]
        ax.plot(t, gbps, color=color, linewidth=0.6, alpha=0.35)  # each monitor sample
        w = 5  # and a moving average over five samples
        smooth = [sum(gbps[max(0, j - w + 1): j + 1]) / len(gbps[max(0, j - w + 1): j + 1]) for j in range(len(gbps))]
        ax.plot(t, smooth, color=color, label=f"{gpu} container (moving average)", linewidth=1.6)
    ax.set_ylabel("NIC throughput, tx + rx\n(Gbit/s at rack scale)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")


def _utilization(ax, job: dict, dilation: float, t0: float) -> None:
    for rank_records in job.get("ranks", {}).values():  # finer grain: each rank's iterations, underlay
        for r in rank_records:
            ax.fill_between([(r["t_start"] - t0) / dilation, (r["t_end"] - t0) / dilation], 0, 100 * r["gpu_util"],
                            color="#aab7b8", alpha=0.12, linewidth=0, step="pre")
    log = job.get("iteration_log", [])
    xs, ys = [], []
    for it in log:
        xs += [(it["t_start"] - t0) / dilation, (it["t_end"] - t0) / dilation]
        ys += [100 * it["gpu_util"]] * 2
    ax.plot(xs, ys, color="#c0392b", linewidth=1.6, label="average over the job's GPUs")
    ax.set_ylim(0, 105)
    ax.set_ylabel("compute fraction of an iteration (%)\n(emulated GPU: compute time / iteration time)")
    ax.set_xlabel("time since the job started (s at rack scale)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def fig3(record: dict, case: str, results: Path) -> Path:
    rate_scale, dilation = _scale(record)
    runs = [r for r in record["runs"] if r["case"] == case and "job" in r]  # the first repeat keeps its detail
    fig, axes = plt.subplots(2, len(runs), figsize=(6 * len(runs), 6.5), sharey="row", squeeze=False)
    for col, run in enumerate(runs):
        job, s = run["job"], run["summary"]
        t0 = min((it["t_start"] for it in job["iteration_log"]), default=job["started_at"] or 0)
        title = "fragmented (policy fixed)" if s["policy"] == "fixed" else "regrouped under one switch"
        title += f", repeat {run.get('repeat', 0) + 1}"
        axes[0][col].set_title(f"{title}: {', '.join(job['gpus'])} under {', '.join(s['switches'])}\n"
                               f"completion {s['completion_rack_s']:.1f} s, mean compute fraction "
                               f"{100 * s['mean_gpu_util']:.0f} %", fontsize=9)
        _throughput(axes[0][col], job, rate_scale, dilation, t0)
        _utilization(axes[1][col], job, dilation, t0)
    fig.suptitle(f"Case ({case}): the job of concern, beside a second job (emulated paper rack)", fontsize=11)
    fig.tight_layout()
    path = results / f"fig3-case-{case}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sweep_figure(record: dict, results: Path) -> Path:
    points = record["sweep"]
    x = [p["nic_to_uplink"] for p in points]
    saving = [100 * p["saving"]["median"] for p in points]
    low = [s - 100 * p["saving"]["min"] for s, p in zip(saving, points, strict=True)]
    high = [100 * p["saving"]["max"] - s for s, p in zip(saving, points, strict=True)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(
        x, [p["fixed"]["mean_iteration_rack_s"] for p in points], "o-", color="#c0392b", label="fragmented (fixed)"
    )
    left.plot(x, [p["regroup"]["mean_iteration_rack_s"] for p in points], "s-", color="#1e8449", label="regrouped")
    left.set_xlabel("k: the uplink runs at 1/k of a GPU NIC's line rate")
    left.set_ylabel("mean iteration time of the 4-GPU job\n(s at rack scale)")
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    left.legend()
    right.errorbar(
        x,
        saving,
        yerr=[low, high],
        fmt="o-",
        color="#2471a3",
        capsize=3,
        label=f"this emulation (median, min-max of {points[0]['repeats']} runs)",
    )
    right.axhline(73.2, color="#7f8c8d", linestyle="--", label="paper, case (a): 73.2 %")
    right.set_xlabel("k: the uplink runs at 1/k of a GPU NIC's line rate")
    right.set_ylabel("completion time saved by regrouping (%)")
    right.set_ylim(0, 100)
    right.grid(alpha=0.3)
    right.legend()
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [f"{v:.3g}" for v in x])
    fig.suptitle("Case (a) against the rate of the uplink between the two aggregator switches", fontsize=11)
    fig.tight_layout()
    path = results / "sweep-uplink.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

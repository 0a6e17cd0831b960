"""The simulator against the emulation: the demo's recorded mean iteration times, point by point.

`make demo` records, for each case and uplink rate, the mean iteration time of the job of
concern fragmented (policy fixed) and regrouped, in rack seconds. Each point is simulated on the
same rack (the recorded rack file with the point's uplink rate), the same two jobs, and the
network calibrated to the emulation (simulator/model/calibration.py): efficiency from the record's own
calibration, and held shares; `sharing="maxmin"` gives the lossless fabric's what-if instead.

The demo starts the two jobs' first iterations at an offset it does not control (containers
start one after another, seconds apart), and when both iterate at the same pace (case b) that
offset decides how much their all-reduces overlap for the whole run. So each point is the mean
over OFFSETS starts of the job beside, spread evenly over one iteration of the job of concern.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from controller.core.rack import parse_rack
from simulator.inputs.workloads import paper_case
from simulator.model import calibration
from simulator.model.engine import Options, Run, policies
from simulator.model.network import SHARINGS

TOLERANCE = 0.15
OFFSETS = 8
WHAT_IF = ", a what-if: the model's sharing for this fabric is {}"


@dataclass
class Point:
    case: str
    label: str  # e.g. "case (a), rack file" or "case (a), NIC:uplink 1:4"
    uplink_gbps: float
    policy: str  # fixed | regroup
    emulated_s: float  # the demo's median of runs (rack seconds)
    runs: list[float]
    simulated_s: float = float("nan")

    @property
    def error(self) -> float:
        return self.simulated_s / self.emulated_s - 1


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _iterations(summary: dict) -> list[float]:
    """The mean iteration times (rack seconds) of a point's runs: one, or several where the demo repeats them."""
    if "runs" in summary:
        return [r["mean_iteration_rack_s"] for r in summary["runs"]]
    return [summary["mean_iteration_rack_s"]]


def points(record: dict) -> list[Point]:
    """Every point the fidelity test compares: both cases at the demo's rack, case (a) at each sweep point."""
    if "points" in record:
        return _medians(record)
    uplink = min(u["rate_gbps"] for w in record["rack"]["switches"] for u in w.get("uplinks", []))
    out = []
    for run in record["runs"]:
        s = run["summary"]
        values = _iterations(s)
        out.append(Point(run["case"], f"case ({run['case']}), demo rack", uplink, s["policy"], _median(values), values))
    for sweep in record.get("sweep", []):
        for policy in ("fixed", "regroup"):
            values = _iterations(sweep[policy])
            if sweep["uplink_gbps"] == uplink and any(p.case == "a" and p.uplink_gbps == uplink for p in out):
                continue  # the sweep's 1:1 point is case (a) at the demo's rack, compared above
            out.append(Point("a", f"case (a), NIC:uplink 1:{sweep['nic_to_uplink']:g}", sweep["uplink_gbps"], policy,
                             _median(values), values))
    return out


def _medians(record: dict) -> list[Point]:
    """The demo's record with repeats: `points` (each case on the fitted rack) and `sweep` (case (a) per
    uplink rate, whose `fitted` entry repeats case (a)'s point), each with per-policy medians."""
    out = []
    for p in record["points"] + [s for s in record.get("sweep", []) if not s.get("name", "").startswith("fitted")]:
        label = (f"case ({p['case']}), demo rack (1:{p['nic_to_uplink']:.3g})" if p in record["points"]
                 else f"case ({p['case']}), NIC:uplink 1:{p['nic_to_uplink']:g}")
        for policy in ("fixed", "regroup"):
            figures = p[policy]
            values = figures.get("mean_iteration_rack_s_values") or [figures["mean_iteration_rack_s"]]
            out.append(Point(p["case"], label, p["uplink_gbps"], policy, figures["mean_iteration_rack_s"], values))
    return out


def fit_points(fit: dict, record: dict) -> tuple[list[Point], calibration.Calibration]:
    """The tried points of a `--fit` record (case (a) at each uplink it tried, each policy's median over its pairs),
    simulated on `record`'s rack and with its calibration: a fit record has neither."""
    if fit.get("kind") != "fit" or not fit.get("tried"):
        raise ValueError("not a fit record (paper_experiment --fit): no 'kind': 'fit' or no tried points")
    cal = calibration.from_record(record)
    out = []
    for tried in fit["tried"]:
        p = tried["point"]
        for policy in ("fixed", "regroup"):
            figures = p[policy]
            values = figures.get("mean_iteration_rack_s_values") or [figures["mean_iteration_rack_s"]]
            out.append(Point("a", p.get("name", "fit"), p["uplink_gbps"], policy, figures["mean_iteration_rack_s"],
                             values))
    settings = {**record.get("settings", {}), **{k: v for k, v in fit.get("settings", {}).items()
                                                 if k in ("iterations", "model")}}
    for p in out:
        p.simulated_s = simulate({**record, "settings": settings}, p, cal)
    return out, cal


def rack_at(record: dict, uplink_gbps: float):
    spec = copy.deepcopy(record["rack"])
    for w in spec["switches"]:
        for u in w.get("uplinks", []):
            u["rate_gbps"] = uplink_gbps
    return parse_rack(spec, f"{record.get('rack_file', 'the demo rack')} with uplinks at {uplink_gbps:g} Gbit/s")


def simulate(record: dict, point: Point, cal: calibration.Calibration, offsets: int = OFFSETS) -> float:
    """The job of concern's mean iteration time (rack seconds) at `point`, simulated with the network
    `cal` gives (its sharing included): the mean over `offsets` starts of the job beside."""
    rack = rack_at(record, point.uplink_gbps)
    settings = record.get("settings", {})
    concern, beside = paper_case(point.case, settings.get("iterations", 60), settings.get("model", "vgg16"))
    options = Options(net=cal.net(rack), step_model="exact")
    policy = policies(300.0)[point.policy]
    first = Run(rack, [concern, beside], policy, options).run().jobs[0]
    times = [first.mean_iteration_s]
    for i in range(1, offsets):
        later = replace(beside, arrival_s=i / offsets * first.alone_iteration_s)
        times.append(Run(rack, [concern, later], policy, options).run().jobs[0].mean_iteration_s)
    return sum(times) / len(times)


def compare(record: dict, case: str | None = None, sharing: str | None = None) \
        -> tuple[list[Point], calibration.Calibration]:
    """Every point (of `case`, or all), simulated with the record's calibration; `sharing` overrides
    the calibrated sharing ("maxmin": the lossless fabric's what-if)."""
    cal = calibration.from_record(record)
    if sharing is not None:
        if sharing not in SHARINGS:
            raise ValueError(f"sharing must be one of {', '.join(SHARINGS)}, not {sharing!r}")
        cal = replace(cal, sharing=sharing)
    out = [p for p in points(record) if case is None or p.case == case]
    for p in out:
        p.simulated_s = simulate(record, p, cal)
    return out, cal


def table(rows: list[Point], cal: calibration.Calibration) -> str:
    what_if = WHAT_IF.format(cal.model_sharing) if cal.sharing != cal.model_sharing else ""
    lines = [f"Against the emulation (`make demo`'s record; network calibrated from {cal.source}: efficiency "
             f"{100 * cal.efficiency:.1f} %, {1000 * cal.step_latency_emulated_s:.1f} ms per ring step emulated, "
             f"{SHARINGS[cal.sharing]}{what_if}):", "",
             f"| point | uplink | job of concern | emulated mean iteration (median of runs) | simulated (mean of "
             f"{OFFSETS} start offsets) | difference |",
             "| --- | --- | --- | --- | --- | --- |"]
    for p in rows:
        lines.append(f"| {p.label} | {p.uplink_gbps:g} Gbit/s | {'fragmented' if p.policy == 'fixed' else 'regrouped'} "
                     f"| {p.emulated_s:.3f} s ({len(p.runs)} runs) | {p.simulated_s:.3f} s | {100 * p.error:+.1f} % |")
    return "\n".join(lines)


# The fidelity test checks every point of every record made with the current model within this
# (evidence/fidelity.py; the droptail record's check keeps TOLERANCE).
RECORD_TOLERANCE = 0.10

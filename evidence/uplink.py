"""What the demo's record shows about a fragmented ring's uplink, beside what the simulator assumes.

Two figures, both from a `make demo` record (default: the droptail one, evidence/records.py DROPTAIL):
- for each run recorded in detail, each flow of the job of concern's ring (rank i -> rank i+1):
  the bytes its sender's NIC sent over the bytes its receiver's NIC received, from the monitor's
  throughput samples. Above 1 by more than the headers' few per cent, the flow resent what a
  queue on its way dropped; and the share of the comm windows (samples while every rank was in
  its all-reduce) in which it delivered under STALLED of the uplink's line rate.
- for each fragmented point, the share of the uplink's line rate the ring's crossing flows got
  while it communicated: the bytes each flow carries per iteration over the mean all-reduce time
  (less the per-step latency), emulated, simulated with held shares (the emulation's calibrated
  network on the droptail fabric) and with max-min sharing (the model on the lossless fabric), each marked
  as the model for the record's fabric or a what-if.

`python -m evidence.uplink [RECORD]` prints both.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from evidence import records
from profiles import WORKLOADS, compute_seconds
from simulator.inputs.workloads import paper_case
from simulator.model import calibration, fidelity

STALLED = 0.10  # a comm window in which a crossing flow delivered under this share of the uplink
RECORD = records.DROPTAIL.relative_to(records.ROOT)  # the droptail record


@dataclass
class Flow:
    run: str
    src: str
    dst: str
    crossing: bool
    sent_over_delivered: float
    stalled_windows: float  # share of the comm windows (crossing flows only; nan for local ones)


def gpu_switches(spec: dict) -> dict[str, str]:
    """The switch each GPU hangs under with the rack file's circuits (the demo's fragmented start)."""
    down = {d["ocs_port"]: w["name"] for w in spec["switches"] for d in w["downlinks"]}
    ends = {a: b for a, b in spec["circuits"]} | {b: a for a, b in spec["circuits"]}
    return {g["name"]: down[ends[g["nic"]["ocs_port"]]] for s in spec["servers"] for g in s["gpus"]
            if ends.get(g["nic"]["ocs_port"]) in down}


def _bytes(samples: list[dict], key: str) -> float:
    return sum(b[key] * (b["t"] - a["t"]) / 8 for a, b in zip(samples, samples[1:], strict=False))


def flows(record: dict) -> list[Flow]:
    """Each ring flow of every run the record holds in detail: fragmented (the policy fixed, the rack
    file's cabling) or regrouped (all under the one switch the job ran on, nothing crosses)."""
    fragmented = gpu_switches(record["rack"])
    uplink_bps = min(u["rate_gbps"] for w in record["rack"]["switches"] for u in w["uplinks"]) * 1e9 \
        * record.get("rate_scale", record["rack"]["emulation"]["rate_scale"])
    out = []
    for run in record["runs"]:
        job = run.get("job")
        if not job:
            continue
        gpus, tp = job["gpus"], job["throughput"]
        where = fragmented if run["summary"]["policy"] == "fixed" else {g: job["switches"][0] for g in gpus}
        comm = {g: [(r["t_start"] + r["compute_s"], r["t_end"]) for r in recs] for g, recs in job["ranks"].items()}
        first = tp[gpus[0]]
        windows = [k for k in range(1, len(first)) if all(any(s <= first[k - 1]["t"] and first[k]["t"] <= e
                                                              for s, e in spans) for spans in comm.values())]
        for i, src in enumerate(gpus):
            dst = gpus[(i + 1) % len(gpus)]
            crossing = where[src] != where[dst]
            stalled = float("nan")
            if crossing and windows:
                stalled = sum(tp[dst][k]["rx_bps"] < STALLED * uplink_bps for k in windows) / len(windows)
            out.append(Flow(run["tag"], src, dst, crossing, _bytes(tp[src], "tx_bps") / _bytes(tp[dst], "rx_bps"),
                            stalled))
    return out


def uplink_share(record: dict, point: fidelity.Point, iteration_s: float, comm_s: float | None = None) -> float:
    """The share of the uplink's line rate each crossing flow of the job of concern got while it
    communicated, for a mean iteration of `iteration_s` (rack seconds); `comm_s`: the all-reduce's
    mean time where it was measured, else the iteration less the ring's compute phase."""
    settings = record.get("settings", {})
    model = settings.get("model", "vgg16")
    concern = paper_case(point.case, 1, model)[0]
    gpus = {g["name"]: g["model"] for s in record["rack"]["servers"] for g in s["gpus"]}
    n, steps = concern.gpus, 2 * (concern.gpus - 1)
    rack = fidelity.rack_at(record, point.uplink_gbps)
    latency = calibration.from_record(record).net(rack).step_latency_s
    if comm_s is None:
        comm_s = iteration_s - max(compute_seconds(model, gpus[g]) for g in concern.names)
    per_flow = steps * WORKLOADS[model].gradient_bytes / n
    return per_flow / (comm_s - steps * latency) / (point.uplink_gbps * 1e9 / 8)


def report(record: dict) -> str:
    lines = ["Ring flows of the job of concern, runs recorded in detail (sent at the sender's NIC / "
             "received at the receiver's):", "",
             "| run | flow | crosses the uplink | sent / received | comm windows with under "
             f"{100 * STALLED:.0f} % of the uplink delivered |", "| --- | --- | --- | --- | --- |"]
    for f in flows(record):
        stalled = f"{100 * f.stalled_windows:.0f} %" if f.crossing else "-"
        lines.append(f"| {f.run} | {f.src} -> {f.dst} | {'yes' if f.crossing else 'no'} | "
                     f"{f.sent_over_delivered:.3f} | {stalled} |")
    lines += ["", "Share of the uplink's line rate each crossing flow of the job of concern got while it communicated, "
              "and its mean iteration (rack seconds):", "",
              f"| point | uplink | emulated (median run) | simulated, shares held{_model('held', record)} | simulated, "
              f"max-min{_model('maxmin', record)} |", "| --- | --- | --- | --- | --- |"]
    for r in shares(record):
        h, m = r.held, r.maxmin
        lines.append(f"| {h.label} | {h.uplink_gbps:g} Gbit/s | {100 * r.emulated:.0f} %, {h.emulated_s:.3f} s | "
                     f"{100 * r.held_share:.0f} %, {h.simulated_s:.3f} s ({100 * h.error:+.1f} %) "
                     f"| {100 * r.maxmin_share:.0f} %, {m.simulated_s:.3f} s ({100 * m.error:+.1f} %) |")
    return "\n".join(lines)


@dataclass
class Share:
    """A fragmented point: the uplink share of each crossing flow while communicating, measured and
    simulated under each sharing (with the simulated points, iteration times and errors)."""

    held: fidelity.Point
    maxmin: fidelity.Point
    emulated: float  # nan where the record has no all-reduce time for the point
    held_share: float
    maxmin_share: float


def shares(record: dict) -> list[Share]:
    """Every fragmented point, simulated with held shares (the emulation's model) and max-min."""
    held, _ = fidelity.compare(record, sharing="held")
    maxmin, _ = fidelity.compare(record, sharing="maxmin")
    out = []
    for h, m in zip(held, maxmin, strict=True):
        if h.policy != "fixed":
            continue
        figures = _summary(record, h)
        emulated = uplink_share(record, h, h.emulated_s, figures["mean_comm_rack_s"]) if figures else float("nan")
        simulated = uplink_share(record, h, h.simulated_s), uplink_share(record, m, m.simulated_s)
        out.append(Share(h, m, emulated, *simulated))
    return out


def _model(sharing: str, record: dict) -> str:
    return " (the model for this fabric)" if calibration.sharing_of(record) == sharing else " (a what-if)"


def _summary(record: dict, p: fidelity.Point) -> dict | None:
    for q in record.get("points", []) + record.get("sweep", []):
        if q["case"] == p.case and q["uplink_gbps"] == p.uplink_gbps:
            return q["fixed"]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evidence.uplink", description=__doc__.splitlines()[0])
    ap.add_argument("record", nargs="?", default=str(RECORD), help=f"make demo's record (default {RECORD})")
    ap.add_argument("--fit", metavar="FIT_RECORD",
                    help="instead: the points a `paper_experiment --fit` record tried, simulated on RECORD's rack and "
                         "calibration (a fit record has neither), against their emulated medians")
    args = ap.parse_args(argv)
    try:
        record = json.loads(Path(args.record).read_text())
    except (OSError, ValueError) as e:
        print(f"error: {args.record}: cannot read the record: {e}", file=sys.stderr)
        return 2
    if "runs" not in record or "rack" not in record:
        print(f"error: {args.record}: not a make demo record (no 'runs' or 'rack')", file=sys.stderr)
        return 2
    if args.fit:
        try:
            rows, cal = fidelity.fit_points(json.loads(Path(args.fit).read_text()), record)
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {args.fit}: cannot use it as a fit record: {e}", file=sys.stderr)
            return 2
        print(f"The fit's tried points ({args.fit}), on the rack and calibration of {args.record}.")
        print(fidelity.table(rows, cal))
        return 0
    print(report(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Reproduce the paper's testbed experiment on the emulated rack (the README's first command).

Case (a): jobs of 4 and 2 GPUs; case (b): 3 and 3. Both jobs of a case run at once, ring
all-reduce on the VGG16 profile, first on the fragmented server-centric placement (policy
fixed), then with the job of concern regrouped under one aggregator switch (policy regroup).
Each pair is repeated, and every figure is the median over the repeats with its spread.

The paper does not say what joined its two aggregator switches; the default rack file's uplink
rate is FITTED to case (a)'s saving (407 s -> 109 s, -73.2 %) with `--fit`, and case (b) is then a
prediction. A sweep of the uplink rate (1:1, the rack file's argued setting before the fit, to
1:8) shows how the saving depends on it.

Before measuring, the host is calibrated (a ring of TCP flows against the emulated line rate,
with idle and stolen CPU); when it cannot carry the emulated rates the rates are halved and it
is tried again, and the calibration is printed beside the results.

Writes a new record every time, never overwriting one: results/records/<UTC time>-<commit>.json (every run,
with the rack file, the versions, the fabric and the simulator's model hash), and beside it, in the directory
of the same name, paper-experiment.md (our figures beside the paper's) and PNG figures like the paper's
Fig. 3. Needs root (it builds the emulated rack).

This module holds the settings, the rack variants, the calibrated testbed, the experiment and the fit, the writing
of records and the command line; the runs on a testbed (a pair of policies repeated, one case, the counters read
around them) are evidence/demo/runs.py's, the figures and self-checks evidence/demo/checks.py's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import yaml

from controller.core.rack import load_rack
from emulation.calibrate import calibrate
from emulation.harness import ROOT, Testbed
from evidence import fingerprint, modelhash, records
from evidence.demo.checks import (  # noqa: F401 (the names tests and callers take from here)
    COMPUTE_FRACTION,
    MAX_SPREAD_PP,
    PAPER,
    calibration_text,
    checks,
    checks_text,
    disturbed,
    fabric_checks,
    passed,
    point,
    spread,
    table,
)
from evidence.demo.runs import TCP, calibrate_counted, log, run_pairs
from evidence.demo.settings import PAPER_RACK, Settings  # noqa: F401 (callers take them from here)
from simulator.inputs.cases import CASES
from simulator.inputs.records import stem as record_stem

MONITOR = ["--optirack-monitor-interval", "0.5"]  # throughput samples every 0.5 s (emulated)
RATE_HALVINGS = 2  # how many times the rates may be halved when the host cannot carry them


def versions() -> dict:
    return records.versions(full=True)


# --- racks ---------------------------------------------------------------------------------
def nic_gbps(spec: dict) -> float:
    return max(g["nic"]["rate_gbps"] for s in spec["servers"] for g in s["gpus"])


def uplink_ratio(spec: dict) -> float:
    """k of a rack: its GPU NICs run k times faster than its inter-switch uplink."""
    return nic_gbps(spec) / min(u["rate_gbps"] for w in spec["switches"] for u in w.get("uplinks", []))


def rack_variant(base: dict, k: float | None = None, rate_scale: float | None = None) -> dict:
    """The rack with every uplink at 1/k of the GPU NICs' line rate and/or another rate scale."""
    spec = json.loads(json.dumps(base))
    if k is not None:
        for w in spec["switches"]:
            for u in w.get("uplinks", []):
                u["rate_gbps"] = round(nic_gbps(spec) / k, 3)
    if rate_scale is not None:
        spec.setdefault("emulation", {})["rate_scale"] = rate_scale
    return spec


def write_rack(spec: dict, path: Path):
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_rack(path), path


# --- the experiment ------------------------------------------------------------------------
def calibrated_testbed(spec: dict, workdir: Path, record: dict):
    """A testbed on `spec` that this host can carry: calibrate, and halve the rates until it can.
    Returns (testbed, spec used); the testbed is entered."""
    for attempt in range(RATE_HALVINGS + 1):
        rack, path = write_rack(spec, workdir / f"rack-{attempt}.yaml")
        tb = Testbed(rack, path, workdir / f"main-{attempt}", MONITOR).__enter__()
        try:
            cal, cal_json = calibrate_counted(tb)
            log(cal.line())
            if not cal.ok:  # a passing burst of steal, or a host that is too slow: once more to tell
                record["calibration"]["runs"].append(cal_json)
                time.sleep(5)
                cal, cal_json = calibrate_counted(tb)
                log(cal.line())
        except BaseException:
            tb.__exit__(None, None, None)
            raise
        record["calibration"]["runs"].append(cal_json)
        if cal.ok:
            return tb, spec
        tb.__exit__(None, None, None)
        if attempt < RATE_HALVINGS:
            scale = spec["emulation"]["rate_scale"] / 2
            log(
                f"this host carried {100 * cal.fraction:.0f} % of the emulated rate; halving the rates (rate_scale "
                f"{scale:g}) and trying again"
            )
            spec = rack_variant(spec, rate_scale=scale)
    log(
        f"WARNING: even at rate_scale {spec['emulation']['rate_scale']:g} this host carried only "
        f"{100 * cal.fraction:.0f} % of the emulated rate; the figures below are skewed by the host"
    )
    record["calibration"]["host_too_slow"] = True
    rack, path = write_rack(spec, workdir / "rack-final.yaml")
    return Testbed(rack, path, workdir / "main-final", MONITOR).__enter__(), spec


def experiment(s: Settings, cases: list[str]) -> dict:
    base = yaml.safe_load(s.rack_file.read_text())
    if s.fabric:
        base.setdefault("emulation", {})["fabric"] = s.fabric
    TCP.start()
    record = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "started_utc": records.utc_stamp(),
        # the simulator's model as the run began: its fingerprint (its predictions on the probe set,
        # evidence/fingerprint.py), which says which records check it, and the older hash over its files, checked
        # again at the end
        "model_fingerprint": fingerprint.current(),
        "model_hash": modelhash.model_hash(),
        "model_files": list(modelhash.MODEL_FILES),
        "settings": {
            "iterations": s.iterations,
            "repeats": s.repeats,
            "model": s.model,
            "sweep": s.sweep,
            "sweep_iterations": s.sweep_iterations,
        },
        "rack_file": str(s.rack_file.relative_to(ROOT)) if s.rack_file.is_relative_to(ROOT) else str(s.rack_file),
        "rack_sha256": hashlib.sha256(s.rack_file.read_bytes()).hexdigest(),
        "rack": base,
        "fabric": base.get("emulation", {}).get("fabric", "lossless"),
        "versions": versions(),
        "calibration": {"runs": []},
        "runs": [],
        "points": [],
        "sweep": [],
    }
    fitted_k = uplink_ratio(base)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        log(f"bringing up the paper rack and the controller ({s.rack_file.name}, NIC:uplink 1:{fitted_k:g})")
        tb, spec = calibrated_testbed(base, tmp, record)
        record["rate_scale"] = spec["emulation"]["rate_scale"]
        try:
            for name in cases:
                case = CASES[name]
                log(f"case ({name}): {case.label}, {s.repeats} repeats")
                pairs = run_pairs(tb, case, s, s.iterations, f"case {name}", record, detail=True)
                uplink = nic_gbps(spec) / fitted_k
                record["points"].append(point(f"case {name}", name, fitted_k, uplink, pairs))
            if s.recalibrate:
                cal, cal_json = calibrate_counted(tb)  # the host again, after the main runs
                log(cal.line())
                record["calibration"]["runs"].append(cal_json)
        finally:
            tb.__exit__(None, None, None)
        for k in s.sweep:
            variant = rack_variant(spec, k=k)
            rack, path = write_rack(variant, tmp / f"uplink-1-{k:g}.yaml")
            uplink = rack.spec.switches[0].uplinks[0].rate_gbps
            log(f"sweep: uplink at 1/{k:g} of a NIC ({uplink:g} Gbit/s), case (a), {s.repeats} repeats")
            with Testbed(rack, path, tmp / f"sweep-{k:g}", MONITOR) as stb:
                pairs = run_pairs(stb, CASES["a"], s, s.sweep_iterations, f"sweep 1:{k:g}", record, detail=False)
            record["sweep"].append(point(f"sweep 1:{k:g}", "a", k, uplink, pairs))
    main_a = next((p for p in record["points"] if p["case"] == "a"), None)
    if s.sweep and main_a is not None:  # the fitted rack's case (a) is a point of the sweep too
        record["sweep"].append({**main_a, "name": f"fitted 1:{fitted_k:g}"})
        record["sweep"].sort(key=lambda p: p["nic_to_uplink"])
    record["checks"] = checks(record["points"], record["sweep"])
    record["checks"].update(fabric_checks(record))
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if modelhash.model_hash() != record["model_hash"]:  # the model's files changed during the run
        record["model_hash_at_start"], record["model_hash"] = record["model_hash"], None
        record["model_fingerprint_at_start"], record["model_fingerprint"] = record["model_fingerprint"], None
        log("WARNING: the simulator's model files changed during the run: the record's model_fingerprint and "
            "model_hash are null")
    return record


# --- fitting the uplink --------------------------------------------------------------------
def fit(
    s: Settings, target: float = PAPER["a"]["reduction"], steps: int = 5, lo: float = 2.0, hi: float = 12.0
) -> dict:
    """Bisect k (NIC:uplink, in log space) until case (a)'s median saving is the paper's. Every step is kept, with
    its calibration and its point's figures (medians, spread), so the fit can be read back from its record."""
    base = yaml.safe_load(s.rack_file.read_text())
    if s.fabric:
        base.setdefault("emulation", {})["fabric"] = s.fabric
    started, bounds = records.utc_stamp(), [lo, hi]
    tried = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for step in range(steps):
            k = math.sqrt(lo * hi)
            rack, path = write_rack(rack_variant(base, k=k), tmp / f"fit-{step}.yaml")
            log(f"fit step {step + 1}/{steps}: NIC:uplink 1:{k:.2f}")
            with Testbed(rack, path, tmp / f"fit-{step}", MONITOR) as tb:
                cal = calibrate(tb)
                log(cal.line())
                pairs = run_pairs(tb, CASES["a"], s, s.iterations, f"fit 1:{k:.2f}", {"runs": []}, detail=False)
            fig = point(f"fit 1:{k:.2f}", "a", k, rack.spec.switches[0].uplinks[0].rate_gbps, pairs)
            saving = fig["saving"]["median"]
            tried.append({"nic_to_uplink": k, "saving": saving, "point": fig, "calibration": cal.to_json()})
            log(f"fit step {step + 1}: 1:{k:.2f} saved {100 * saving:.1f} % (target {100 * target:.1f} %)")
            lo, hi = (k, hi) if saving < target else (lo, k)
    best = min(tried, key=lambda t: abs(t["saving"] - target))
    gbps = nic_gbps(base) / best["nic_to_uplink"]
    return {"kind": "fit", "started_utc": started, "versions": versions(),
            "fabric": base.get("emulation", {}).get("fabric", "lossless"),
            "rack_file": str(s.rack_file.relative_to(ROOT)) if s.rack_file.is_relative_to(ROOT) else str(s.rack_file),
            "rack_sha256": hashlib.sha256(s.rack_file.read_bytes()).hexdigest(),
            "settings": {"iterations": s.iterations, "repeats": s.repeats, "model": s.model, "steps": steps,
                         "bounds": bounds},
            "target": target, "tried": tried, "nic_to_uplink": best["nic_to_uplink"], "uplink_gbps": round(gbps, 1)}


def write_fit(result: dict, results: Path) -> Path:
    """results/fits/<UTC start>-<commit>[-dirty].json: a fit's every step, never overwriting another fit."""
    v = result["versions"]
    name = record_stem(result["started_utc"], v.get("optirack"), bool(v.get("git_dirty")))
    return records.write_new(results / "fits" / f"{name}.json", result)


# --- output ---------------------------------------------------------------------------------
def record_path(record: dict, results: Path) -> Path:
    """results/records/<UTC start>-<commit>[-dirty].json; its tables and figures go in the directory of that stem."""
    v = record["versions"]
    name = record_stem(record["started_utc"], v.get("optirack"), bool(v.get("git_dirty")))
    return results / "records" / f"{name}.json"


def write_results(record: dict, results: Path) -> list[Path]:
    """The record (a new file: never one that exists) and, in the directory of its stem, its tables and figures."""
    from scripts.plots import fig3, sweep_figure

    path = records.write_new(record_path(record, results), record)
    results = path.with_suffix("")
    results.mkdir()
    settings = record["settings"]
    md = [
        f"# The paper's experiment on the emulated rack ({record['started']})",
        "",
        f"Rack `{record['rack_file']}` (sha256 {record['rack_sha256'][:12]}), emulated at rate scale "
        f"{record['rate_scale']:g}; {settings['model']} profile; each job of concern ran "
        f"{settings['iterations']} iterations ({settings['sweep_iterations']} in the sweep), "
        f"each pair {settings['repeats']} times; figures are medians over "
        f"the repeats, times in rack seconds (emulated seconds divided by the time dilation). Versions: "
        + ", ".join(f"{k} {v}" for k, v in record["versions"].items() if v is not None)
        + f"; the {record['fabric']} fabric; the simulator's model hash "
        + (record["model_hash"] or "unknown")[:12] + ".",
        "",
        "Calibration of this host:",
        "",
        calibration_text(record),
        "",
        table(record),
        "",
        "Checks:",
        "",
        checks_text(record),
        "",
    ]
    (results / "paper-experiment.md").write_text("\n".join(md))
    figures = [fig3(record, name, results) for name in sorted({p["case"] for p in record["points"]})]
    if record["sweep"]:
        figures.append(sweep_figure(record, results))
    return [path, results / "paper-experiment.md", *figures]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick", action="store_true", help="case (a) only, one repeat, few iterations, no sweep, one calibration (CI)"
    )
    p.add_argument("--iterations", type=int, help="iterations of each job of concern (default 12; --quick 4)")
    p.add_argument("--repeats", type=int, help="runs of each fragmented/regrouped pair (default 3; --quick 1)")
    p.add_argument("--cases", default=None, help="which cases, e.g. a,b (default a,b; --quick a)")
    p.add_argument(
        "--sweep",
        default=None,
        help="uplink at 1/k of a NIC's rate, for these k (default 1,2,4,8; --quick none; 'none')",
    )
    p.add_argument("--rack", type=Path, default=PAPER_RACK, help="rack file (default %(default)s)")
    p.add_argument(
        "--fit",
        action="store_true",
        help="instead of the experiment: find the uplink rate at which case (a) saves the paper's 73.2 %%",
    )
    p.add_argument("--results", type=Path, default=ROOT / "results",
                   help="output folder (default %(default)s): a new record in its records/ every run")
    p.add_argument(
        "--fabric",
        choices=["lossless", "droptail"],
        help="the emulated fabric, overriding the rack file's emulation.fabric (default: the rack file's, lossless)",
    )
    args = p.parse_args(argv)
    quick = args.quick
    iterations = args.iterations or (4 if quick else 12)
    repeats = args.repeats or (1 if quick else 3)
    cases = (args.cases or ("a" if quick else "a,b")).split(",")
    sweep_text = args.sweep or ("none" if quick else "1,2,4,8")
    sweep = [] if sweep_text == "none" else [float(x) for x in sweep_text.split(",")]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case {', '.join(unknown)} (cases: a, b)")
    s = Settings(
        iterations,
        repeats,
        results=args.results,
        sweep=sweep,
        sweep_iterations=iterations,
        rack_file=args.rack.resolve(),
        recalibrate=not quick,
        fabric=args.fabric,
    )
    t0 = time.monotonic()
    if args.fit:
        result = fit(s)
        tried = ", ".join(f"1:{t['nic_to_uplink']:.2f} -> {100 * t['saving']:.1f} %" for t in result["tried"])
        log(
            f"fitted: NIC:uplink 1:{result['nic_to_uplink']:.2f}, an uplink of {result['uplink_gbps']:g} Gbit/s "
            f"(tried {tried}); put it in {args.rack}'s uplinks"
        )
        log(f"wrote {write_fit(result, args.results)}")
        return 0
    record = experiment(s, cases)
    record["wall_s"] = time.monotonic() - t0
    files = write_results(record, args.results)
    print("\n" + calibration_text(record) + "\n\n" + table(record) + "\n\n" + checks_text(record) + "\n")
    log(
        f"finished in {record['wall_s'] / 60:.1f} min; wrote "
        + ", ".join(str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f) for f in files)
    )
    if not passed(record):
        log("FAILED: a self-check above did not pass (exit 1)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Reproduce the paper's testbed experiment on the emulated rack (the README's first command).

Case (a): jobs of 4 and 2 GPUs; case (b): 3 and 3. Both jobs of a case run at once, ring
all-reduce on the VGG16 profile, first on the fragmented server-centric placement (policy
fixed), then with the job of concern regrouped under one aggregator switch (policy regroup).
Each job's completion time, its containers' NIC throughput over time (from the monitor app)
and its GPU utilization over time are recorded. A sweep over the inter-switch uplink
oversubscription shows how the reduction depends on it.

Writes results/paper-experiment.json (every run, with the rack file and versions),
results/paper-experiment.md (our figures beside the paper's) and PNG figures like the paper's
Fig. 3. Needs root (it builds the emulated rack).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from controller.core.rack import load_rack
from emulation.harness import ROOT, Testbed

PAPER_RACK = ROOT / "topologies" / "paper-testbed.yaml"
# The rack file's starting cabling: srv1 and srv2 under as1, srv3 and srv4 under as2.
FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]
MONITOR = ["--optirack-monitor-interval", "0.5"]  # throughput samples every 0.5 s (emulated)
PAPER = {  # Yan et al., OFC 2022, section 3
    "a": {"before_s": 407, "after_s": 109, "reduction": 0.732, "util": "3x"},
    "b": {"before_s": 368, "after_s": 140, "reduction": 0.620, "util": "no significant change"},
}


@dataclass
class Case:
    name: str
    concern: list[str]  # the job the paper reports (red)
    other: list[str]  # the job running beside it (blue)
    label: str = ""


CASES = {
    # With the starting cabling, red's GPUs sit 2 + 2 (case a) or 2 + 1 (case b) under the two
    # switches and blue's 1 + 1 or 1 + 2: both rings cross the uplink, as in the paper's Fig. 3.
    "a": Case("a", ["gpu1", "gpu2", "gpu3", "gpu4"], ["gpu5", "gpu6"], "jobs of 4 and 2 GPUs"),
    "b": Case("b", ["gpu1", "gpu2", "gpu3"], ["gpu5", "gpu6", "gpu4"], "jobs of 3 and 3 GPUs"),
}


@dataclass
class Settings:
    iterations: int
    model: str = "vgg16"
    results: Path = ROOT / "results"
    sweep: list[float] = field(default_factory=list)  # k: an uplink runs at 1/k of a GPU NIC's line rate
    sweep_iterations: int = 0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def versions() -> dict:
    def cmd(*args):
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return None

    import torch

    git = cmd("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD")
    return {"optirack": git, "python": platform.python_version(), "torch": torch.__version__,
            "kernel": platform.release(), "openvswitch": cmd("ovs-vsctl", "--version"),
            "docker": cmd("docker", "version", "--format", "{{.Server.Version}}"), "mininet": cmd("mn", "--version")}


def wait_job(tb: Testbed, job_id: str, what: str, total: int, timeout: float) -> dict:
    deadline, last = time.monotonic() + timeout, -1
    while True:
        job = tb.client.get(f"/jobs/{job_id}")["job"]
        if job["iterations_done"] != last and job["iterations_done"] % 5 == 0:
            last = job["iterations_done"]
            log(f"  {what}: {job_id} {job['state']}, iteration {job['iterations_done']}/{total}")
        if job["state"] not in ("pending", "configuring", "running"):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job_id} did not finish within {timeout:.0f} s")
        time.sleep(1)


def run_case(tb: Testbed, case: Case, policy: str, s: Settings, tag: str) -> dict:
    """Both jobs of a case at once from the fragmented start; the job of concern uses `policy`."""
    tb.client.put("/ocs/circuits", {"circuits": FRAGMENTED})
    workload = {"model": s.model, "iterations": s.iterations}
    red = tb.client.post("/jobs", {"name": f"{tag} red", "gpus": case.concern, "policy": policy, "workload": workload})["job"]
    blue = tb.client.post("/jobs", {"name": f"{tag} blue", "gpus": case.other, "policy": "fixed",
                                    "workload": {**workload, "iterations": s.iterations * 20}})["job"]
    log(f"  {tag}: {red['id']} on {','.join(case.concern)} ({policy}), {blue['id']} on {','.join(case.other)} (fixed)")
    done = wait_job(tb, red["id"], tag, s.iterations, timeout=60 + 30 * s.iterations)
    tb.client.post(f"/jobs/{blue['id']}/stop")  # blue ran beside red for red's whole run
    detail = tb.client.get(f"/jobs/{red['id']}", history=100_000)["job"]
    other = tb.client.get(f"/jobs/{blue['id']}", history=100_000)["job"]
    if done["state"] != "done":
        raise RuntimeError(f"{tag}: {red['id']} {done['state']}: {done['reason']}")
    its = detail["iteration_log"]
    dilation = tb.rack.spec.emulation.time_dilation
    summary = {"policy": policy, "switches": detail["switches"], "completion_s": detail["completion_s"],
               "completion_rack_s": detail["completion_s"] / dilation, "mean_iteration_s": statistics.fmean(i["iter_s"] for i in its),
               "mean_iteration_rack_s": statistics.fmean(i["iter_s"] for i in its) / dilation,
               "mean_comm_s": statistics.fmean(i["comm_s"] for i in its), "mean_gpu_util": statistics.fmean(i["gpu_util"] for i in its)}
    log(f"  {tag}: {red['id']} done in {summary['completion_s']:.1f} s on {','.join(detail['switches'])}, "
        f"mean iteration {summary['mean_iteration_s']:.3f} s, GPU utilization {summary['mean_gpu_util']:.2f}")
    return {"case": case.name, "tag": tag, "summary": summary, "job": detail, "other_job": other}


def rack_with_uplink_ratio(base: dict, k: float) -> dict:
    """The paper rack with every uplink at 1/k of the GPU NICs' line rate (k = 1: the rack file's)."""
    spec = json.loads(json.dumps(base))
    nic = max(g["nic"]["rate_gbps"] for s in spec["servers"] for g in s["gpus"])
    for w in spec["switches"]:
        for u in w.get("uplinks", []):
            u["rate_gbps"] = round(nic / k, 3)
    return spec


def sweep_point(ratio: float, fixed: dict, regroup: dict, uplink: float) -> dict:
    return {"nic_to_uplink": ratio, "uplink_gbps": uplink, "fixed": fixed, "regroup": regroup,
            "reduction": 1 - regroup["completion_s"] / fixed["completion_s"]}


def experiment(s: Settings, cases: list[str]) -> dict:
    rack = load_rack(PAPER_RACK)
    record = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "settings": {"iterations": s.iterations, "model": s.model,
              "sweep": s.sweep, "sweep_iterations": s.sweep_iterations},
              "rack_file": str(PAPER_RACK.relative_to(ROOT)), "rack_sha256": hashlib.sha256(PAPER_RACK.read_bytes()).hexdigest(),
              "rack": yaml.safe_load(PAPER_RACK.read_text()), "versions": versions(), "runs": [], "sweep": []}
    with tempfile.TemporaryDirectory() as tmp:
        log(f"bringing up the paper rack and the controller ({rack.summary().splitlines()[0]})")
        with Testbed(rack, PAPER_RACK, Path(tmp) / "main", MONITOR) as tb:
            for name in cases:
                case = CASES[name]
                log(f"case ({name}): {case.label}")
                for policy, label in (("fixed", "fragmented"), ("regroup", "regrouped")):
                    record["runs"].append(run_case(tb, case, policy, s, f"case {name} {label}"))
        base = yaml.safe_load(PAPER_RACK.read_text())
        for ratio in s.sweep:
            spec = rack_with_uplink_ratio(base, ratio)
            path = Path(tmp) / f"uplink-1-{ratio:g}.yaml"
            path.write_text(yaml.safe_dump(spec))
            r = load_rack(path)
            uplink = r.spec.switches[0].uplinks[0].rate_gbps
            log(f"sweep: uplink at 1/{ratio:g} of a NIC ({uplink:g} Gbit/s), case (a)")
            with Testbed(r, path, Path(tmp) / f"sweep-{ratio:g}", MONITOR) as tb:
                sweep_settings = Settings(s.sweep_iterations, s.model, s.results)
                runs = {policy: run_case(tb, CASES["a"], policy, sweep_settings, f"sweep 1:{ratio:g} {policy}")
                        for policy in ("fixed", "regroup")}
            record["sweep"].append(sweep_point(ratio, runs["fixed"]["summary"], runs["regroup"]["summary"], uplink))
    by = {(r["case"], r["summary"]["policy"]): r["summary"] for r in record["runs"]}
    if s.sweep and ("a", "fixed") in by:  # the rack file's own uplink is the sweep's 1:1 point
        uplink = rack.spec.switches[0].uplinks[0].rate_gbps
        record["sweep"].insert(0, sweep_point(1.0, by[("a", "fixed")], by[("a", "regroup")], uplink))
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return record


def table(record: dict) -> str:
    rows = ["| case | job | fragmented (fixed) | regrouped | completion time saved | GPU utilization | paper |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    by = {(r["case"], r["summary"]["policy"]): r for r in record["runs"]}
    for name in sorted({r["case"] for r in record["runs"]}):
        f, g = by[(name, "fixed")]["summary"], by[(name, "regroup")]["summary"]
        p = PAPER[name]
        red = CASES[name].concern
        rows.append(f"| ({name}) | {len(red)} GPUs ({','.join(red)}) | {f['completion_s']:.1f} s "
                    f"({f['completion_rack_s']:.1f} rack s) | {g['completion_s']:.1f} s ({g['completion_rack_s']:.1f} rack s) "
                    f"| {100 * (1 - g['completion_s'] / f['completion_s']):.1f} % "
                    f"| {f['mean_gpu_util']:.2f} → {g['mean_gpu_util']:.2f} ({g['mean_gpu_util'] / f['mean_gpu_util']:.2f}×) "
                    f"| {p['before_s']} s → {p['after_s']} s, −{100 * p['reduction']:.1f} %, utilization {p['util']} |")
    out = "\n".join(rows)
    if record["sweep"]:
        out += ("\n\nCase (a) against the inter-switch uplink's rate (GPU NIC : uplink; 1:1 is the rack file's):\n\n"
                "| NIC : uplink | uplink | fragmented, mean iteration | regrouped, mean iteration | completion time saved "
                "| GPU utilization |\n| --- | --- | --- | --- | --- | --- |\n")
        out += "\n".join(f"| 1:{p['nic_to_uplink']:g} | {p['uplink_gbps']:g} Gbit/s | {p['fixed']['mean_iteration_rack_s']:.3f} s | "
                         f"{p['regroup']['mean_iteration_rack_s']:.3f} s | {100 * p['reduction']:.1f} % | "
                         f"{p['fixed']['mean_gpu_util']:.2f} → {p['regroup']['mean_gpu_util']:.2f} |" for p in record["sweep"])
    return out


def write_results(record: dict, results: Path) -> list[Path]:
    from scripts.plots import fig3, sweep_figure

    results.mkdir(parents=True, exist_ok=True)
    (results / "paper-experiment.json").write_text(json.dumps(record, indent=1))
    settings = record["settings"]
    md = [f"# The paper's experiment on the emulated rack ({record['started']})", "",
          f"Rack `{record['rack_file']}` (sha256 {record['rack_sha256'][:12]}), {settings['model']} profile, "
          f"{settings['iterations']} iterations per job of concern; emulated seconds, and rack seconds (emulated "
          f"seconds divided by the time dilation). Versions: " + ", ".join(f"{k} {v}" for k, v in record["versions"].items() if v),
          "", table(record), ""]
    (results / "paper-experiment.md").write_text("\n".join(md))
    figures = [fig3(record, name, results) for name in sorted({r["case"] for r in record["runs"]})]
    if record["sweep"]:
        figures.append(sweep_figure(record, results))
    return [results / "paper-experiment.json", results / "paper-experiment.md", *figures]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="case (a) only, few iterations, one sweep point (CI)")
    p.add_argument("--iterations", type=int, help="iterations of each job of concern (default 60; --quick 8)")
    p.add_argument("--cases", default=None, help="which cases, e.g. a,b (default a,b; --quick a)")
    p.add_argument("--sweep", default=None,
                   help="uplink at 1/k of a NIC's rate, for these k (default 2,4,8; --quick 8; 'none'); k = 1 is case (a)")
    p.add_argument("--results", type=Path, default=ROOT / "results", help="output folder (default %(default)s)")
    args = p.parse_args(argv)
    quick = args.quick
    iterations = args.iterations or (8 if quick else 60)
    cases = (args.cases or ("a" if quick else "a,b")).split(",")
    sweep_text = args.sweep or ("8" if quick else "2,4,8")
    sweep = [] if sweep_text == "none" else [float(x) for x in sweep_text.split(",")]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case {', '.join(unknown)} (cases: a, b)")
    s = Settings(iterations, results=args.results, sweep=sweep, sweep_iterations=max(6, iterations // 3))
    t0 = time.monotonic()
    record = experiment(s, cases)
    record["wall_s"] = time.monotonic() - t0
    files = write_results(record, args.results)
    print("\n" + table(record) + "\n")
    log(f"finished in {record['wall_s'] / 60:.1f} min; wrote " + ", ".join(str(f.relative_to(ROOT)) if f.is_relative_to(ROOT)
                                                                    else str(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())

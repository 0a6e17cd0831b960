"""The neighbours' headline figures beside ours: each experiment writes one small record,
results/neighbours/NAME.json, that evidence/report/neighbours.py turns into the docs' tables.

    python scripts/neighbours.py all                 # every experiment below, one after another
    python scripts/neighbours.py oddl-table1         # ODDL's Table 1: 4 nodes, ResNet50, 20 epochs
    python scripts/neighbours.py oddl-scale          # ODDL vs regroup vs static as the rack grows
    python scripts/neighbours.py oddl-delay          # ODDL as its switching goes from ns to ms
    python scripts/neighbours.py panama              # short flows' p99 against aggregation load; collectives
    python scripts/neighbours.py cassini             # the seed's pairs of jobs: unfair sharing, time shifting
    python scripts/neighbours.py headline            # TopoOpt-like and SiP-ML-like against the static fat tree
    python scripts/neighbours.py lumoscore           # static Clos vs regroup, 4,096 and 16,384 GPUs, LLM-like jobs

Workload runs are `optirack simulate` runs (their commands are in the records), one process each (--workers 1).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from simulator.cli import main as cli  # noqa: E402
from simulator.model import sharing, shortflows  # noqa: E402

OUT = ROOT / "results" / "neighbours"
IMAGENET = 1_281_167  # ImageNet-1k training images
GROWTH = (64, 256, 1024, 4096)  # rack sizes
DELAYS_S = (10.5e-9, 1e-6, 10e-6, 100e-6, 1e-3, 25e-3)  # ODDL's switching: ns to a MEMS OCS's 25 ms
FIELDS = ("mean", "p50", "p95", "p99")
CONTENDED = ("--oversubscription", "32", "--spare", "1.5")  # a switch's uplink at one NIC's rate: rings contend


def simulate(args: list[str]) -> dict:
    """One `optirack simulate` run (no plots, one process); its command and per-policy figures."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["simulate", *args, "--no-plots", "--quiet", "--workers", "1", "--out", tmp]
        with contextlib.redirect_stdout(io.StringIO()):
            p = argparse.ArgumentParser(prog="optirack")
            cli.add_parser(p.add_subparsers(dest="command", required=True))
            ns = p.parse_args(argv)
            if ns.func(ns) != 0:
                raise RuntimeError(f"optirack simulate {' '.join(args)} failed")
        record = json.loads((Path(tmp) / "results.json").read_text())
    out = {"command": "optirack simulate " + " ".join(args), "workload": record["workload"]["description"],
           "rack": record["rack"]["summary"], "policies": {}}
    for name, p in record["policies"].items():
        s = p["summary"]
        out["policies"][name] = {
            "label": p["label"], "jct_s": {k: s["jct_s"][k] for k in FIELDS},
            "slowdown_mean": s["slowdown"]["mean"], "queue_mean_s": s["queue_s"]["mean"],
            "makespan_s": s["makespan_s"], "computing": s["gpu_computing"], "shared_jobs": s["shared_jobs"],
            "jct_vs_baseline": p["against_baseline"].get("jct_s.mean"), "wall_s": s["wall_s"]}
        if "seeds" in record:  # --seeds: each figure's mean and 95 % interval over the seeds
            out["policies"][name]["seeds"] = record["seeds"]["policies"][name]
            out["seeds"] = record["seeds"]["seeds"]
        jobs = p.get("jobs") or []
        if jobs and len(jobs) <= 4:
            out["policies"][name]["jobs"] = [{k: j[k] for k in ("gpus", "start_s", "end_s") if k in j} for j in jobs]
    return out


def _trace(rows: list[tuple[float, int, str, int]]) -> Path:
    f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    f.write("arrival_s,gpus,model,iterations\n" + "".join(f"{a},{g},{m},{i}\n" for a, g, m, i in rows))
    f.close()
    return Path(f.name)


def oddl_table1() -> dict:
    """4 nodes of one GPU, ResNet50, 20 epochs of ImageNet at batch 16 per GPU: ODDL and one electrical switch."""
    iterations = -(-20 * IMAGENET // (16 * 4))
    trace = _trace([(0.0, 4, "resnet50", iterations)])
    try:
        run = simulate(["--gpus", "4", "--gpus-per-server", "1", "--gpus-per-switch", "4", "--models", "V100",
                        "--oversubscription", "1", "--spare", "1", "--trace", str(trace), "--policies", "ideal,oddl",
                        "--baseline", "ideal"])
    finally:
        trace.unlink()
    run["command"] = run["command"].replace(str(trace), f"TRACE (one job: 0,4,resnet50,{iterations})")
    minutes = {n: p["jct_s"]["mean"] / 60 for n, p in run["policies"].items()}
    return {"paper": {"oddl_min": 97.8, "electrical_min": 97.3, "source": "ODDL, Li et al., OFC 2023, Table 1 "
                      "(Ascend 910, HD)"},
            "ours": {"oddl_min": minutes["oddl"], "electrical_min": minutes["ideal"], "iterations": iterations},
            "run": run}


def oddl_scale() -> dict:
    rows = {}
    for gpus in GROWTH:
        jobs = max(200, gpus // 4)
        rows[gpus] = simulate(["--gpus", str(gpus), "--jobs", str(jobs), "--seed", "7", "--seeds", "5", *CONTENDED,
                               "--policies", "static,regroup,oddl", "--baseline", "static"])
    return {"sizes": list(GROWTH), "runs": rows}


def oddl_delay() -> dict:
    runs = {}
    base = ["--gpus", "1024", "--jobs", "500", "--seed", "7", *CONTENDED, "--oddl-control-us", "0"]
    runs["reference"] = simulate([*base, "--policies", "static,regroup", "--baseline", "static"])
    for d in DELAYS_S:
        runs[f"{d:g}"] = simulate([*base, "--policies", "oddl", "--oddl-switch-ns", f"{d * 1e9:g}"])
    return {"delays_s": list(DELAYS_S), "runs": runs}


def panama() -> dict:
    fig = shortflows.figure()
    work = simulate(["--gpus", "1024", "--jobs", "500", "--seed", "7", *CONTENDED,
                     "--policies", "regroup,switchml,panama,ideal", "--baseline", "regroup"])
    return {"paper": {"order": ["ring all-reduce", "SwitchML (+ load balancing)", "PANAMA", "ideal"],
                      "y_axis_s": [0.0, 0.5], "loads": [0.01, 0.8],
                      "source": "PANAMA, Gebara, Costa and Ghobadi, MLSys 2021, the authors' slides, slide 20 (1,024 "
                                "servers, fat tree; curve values not given in the text)"},
            "shortflows": fig, "workload": work}


def cassini() -> dict:
    return {"rows": sharing.table(), "gpu": "V100", "link_gbps": 100.0, "ranks": 8}


def headline() -> dict:
    """Each job size alone (no sharing: the fabric's bandwidth) and the shared workload."""
    alone = {}
    for model in ("vgg16", "resnet50"):
        for gpus in (8, 64, 512):
            trace = _trace([(0.0, gpus, model, 200)])
            try:
                run = simulate(["--gpus", "1024", "--trace", str(trace), "--policies", "static,topoopt,sipml",
                                "--baseline", "static"])
            finally:
                trace.unlink()
            alone[f"{model}:{gpus}"] = {n: p["jct_s"]["mean"] for n, p in run["policies"].items()}
    work = simulate(["--gpus", "1024", "--jobs", "500", "--seed", "7", "--policies", "static,regroup,topoopt,sipml",
                     "--baseline", "static"])
    return {"paper": {"topoopt_x": 3.4, "sipml_x": [1.3, 9.1],
                      "source": "Ghobadi, \"Networks for Machine Learning Jobs\" (TopoOpt vs fat-trees, A100 testbed, "
                                "100 Gbps) and SiP-ML, Khani et al., SIGCOMM 2021 "
                                "(SiP-ML vs electrical fabrics, simulations of three DNNs)"},
            "alone_jct_s": alone, "workload": work}


LLM_SIZES = {8: .25, 16: .15, 32: .15, 64: .15, 128: .12, 256: .1, 512: .05, 1024: .03}  # assumed: LLM-like


def llm_trace(gpus: int, jobs: int, seed: int, load: float = 0.9, model: str = "transformer:7e9") -> list[tuple]:
    """An LLM-like trace (LumosCore's is not published in what we have): GPUs per job by LLM_SIZES, run times
    log-uniform in [10 min, 6 h] as iterations of `model` alone (8 A100s of 100 Gbit/s, NVLink 2,400 Gbit/s),
    Poisson arrivals offering `load` of the rack's GPU-seconds."""
    from simulator.model import models
    from simulator.model.network import GBPS

    c = models.cost(model, ["A100"] * 8, 8, 2400 * GBPS, 100 * GBPS)
    iteration = max(c.compute_s) + 2 * 7 / 8 * c.gradient_bytes / (100 * GBPS)
    rng = random.Random(seed)
    drawn = [(rng.choices(list(LLM_SIZES), list(LLM_SIZES.values()))[0],
              math.exp(rng.uniform(math.log(600), math.log(21600)))) for _ in range(jobs)]
    rate = load * gpus / (sum(g * d for g, d in drawn) / jobs)
    rows, t = [], 0.0
    for g, d in drawn:
        t += rng.expovariate(rate)
        rows.append((round(t, 1), g, model, max(1, round(d / iteration))))
    return rows


def lumoscore() -> dict:
    runs = {}
    for gpus, jobs in ((4096, 600), (16384, 1500)):
        for fabric, extra in (("16:1", ()), ("32:1", CONTENDED)):
            trace = _trace(llm_trace(gpus, jobs, seed=7))
            try:
                run = simulate(["--gpus", str(gpus), "--trace", str(trace), "--models", "A100", "--nvlink-gbps",
                                "2400", *extra, "--policies", "static,regroup", "--baseline", "static"])
            finally:
                trace.unlink()
            run["command"] = run["command"].replace(str(trace), f"TRACE (llm_trace({gpus}, {jobs}, seed=7))")
            runs[f"{gpus} {fabric}"] = run
    return {"paper": {"jct_mean_change": -34.1, "gpus": 16384,
                      "source": "LumosCore (Han et al., arXiv 2411.01503): mean JCT against a static Clos, "
                                "16k-GPU simulation (from its abstract)"},
            "sizes": LLM_SIZES, "runs": runs}


EXPERIMENTS = {"oddl-table1": oddl_table1, "oddl-scale": oddl_scale, "oddl-delay": oddl_delay, "panama": panama,
               "cassini": cassini, "headline": headline,
               "lumoscore": lumoscore}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", choices=["all", *EXPERIMENTS])
    p.add_argument("--out", type=Path, default=OUT, help="folder for the records (%(default)s)")
    args = p.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in EXPERIMENTS if args.experiment == "all" else [args.experiment]:
        t0 = time.monotonic()
        data = EXPERIMENTS[name]()
        data.update(experiment=name, command=f"python scripts/neighbours.py {name}", commit=commit,
                    wall_s=round(time.monotonic() - t0, 1))
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {data['wall_s']} s -> {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

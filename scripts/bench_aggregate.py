#!/usr/bin/env python3
"""Benchmark: in-network aggregation against ring all-reduce, one job on the emulated paper rack, through the
controller's REST API as a user submits it.

The rack and a controller are brought up; the job's GPUs (default gpu1-gpu4) are cabled under the switch of the
first aggregator (as1 on the paper rack) by the OCS, and then the same job (the worker's vgg16 profile, its
compute phase and its scaled gradient) is submitted --repeats times with `"collective": "ring"` and as often with
`"collective": "aggregate"`, alternately (ring first in odd pairs, aggregate first in even ones), one job at a time.
Each run keeps, from the workers' lines the controller holds at its end: the median over its iterations (the first
left out: connections and the aggregator's join) of the all-reduce time (the slowest rank's) and of the iteration
time (likewise), whether every iteration's sum was exact (the worker checks it), the collective each rank's start
line says it ran, and the job's switches and `aggregation` field.

The prediction beside each run is the simulator's (`optirack simulate`'s model): the job alone on the same rack,
policy `regroup` for the ring and `panama` for aggregation (one step of S bytes each way at the NIC's calibrated rate,
plus one step's fixed cost), with the network calibrated from the newest whole `make demo` record of the current
model (simulator/model/calibration.py), in rack seconds: the emulated times divided by the rack's time dilation.
It models the aggregator at line rate: the slot pool's window and the aggregator's own software are not in it.
Needs root and the worker image; for a record, run it with nothing else running on the machine:

    python -m scripts.bench_aggregate --repeats 5 --json results/bench/<UTC>-<commit>-bench_aggregate.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    from scripts.stats import add_json_option, write_json
except ModuleNotFoundError:  # run as a file: scripts/ itself is on sys.path
    from stats import add_json_option, write_json

COLLECTIVES = ("ring", "aggregate")
ENDED = ("done", "failed", "stopped")


# --- pure parts (tests/unit/test_bench_aggregate.py) ----------------------------------------------------------
def run_figures(lines: dict[str, list[dict]]) -> dict:
    """One run's figures from each GPU's JSON lines: the medians over iterations (the first left out) of the
    slowest rank's all-reduce and iteration time (emulated seconds), whether every sum was exact, and the
    collective the ranks' start lines name (one, or 'mixed')."""
    if not lines:
        raise ValueError("a run without any worker's lines")
    per_rank = []
    for gpu, records in sorted(lines.items()):
        its = {r["iteration"]: r for r in records if r.get("event") == "iteration"}
        if not its:
            raise ValueError(f"{gpu}: no iteration line")
        per_rank.append(its)
    common = sorted(set.intersection(*(set(r) for r in per_rank)))
    kept = common[1:] or common
    comm = [max(r[i]["comm_s"] for r in per_rank) for i in kept]
    iters = [max(r[i]["iter_s"] for r in per_rank) for i in kept]
    starts = {r.get("collective", "ring") for records in lines.values() for r in records if r.get("event") == "start"}
    done = [next((r for r in reversed(records) if r.get("event") == "done"), None) for records in lines.values()]
    return {"iterations": len(kept), "all_reduce_s": statistics.median(comm), "iteration_s": statistics.median(iters),
            "exact_sums": all(d is not None and d.get("check") == "ok" for d in done),
            "collective_run": starts.pop() if len(starts) == 1 else "mixed" if starts else "no start line"}


def gather(seen: dict[str, dict[str, None]], logs: dict[str, list[str]]) -> None:
    """Add each worker's JSON lines not seen before to `seen` (by GPU, in the order first seen), heartbeats left out:
    the controller serves only a worker's last lines, so a run's lines are gathered over several reads."""
    for gpu, xs in logs.items():
        mine = seen.setdefault(gpu, {})
        for x in xs:
            if x in mine or not x.startswith("{"):
                continue
            try:
                if json.loads(x).get("event") != "alive":
                    mine[x] = None
            except ValueError:
                continue


def summarise(runs: list[dict], dilation: float, predicted: dict[str, float], bar: float = 1.3,
              tolerance: float = 0.10) -> dict:
    """Per collective the median over runs of each run's medians (rack seconds for iterations), the all-reduce's and
    the iteration's speed-up of aggregate over ring, the simulator's predicted iteration time and speed-up, each
    run's error against it, and what holds: all-reduce >= `bar` x faster, every run within `tolerance` of the
    prediction, every sum exact and every run the collective it asked for."""
    out: dict = {}
    for c in COLLECTIVES:
        mine = [r for r in runs if r["collective"] == c]
        if not mine:
            raise ValueError(f"no {c} run to summarise")
        for r in mine:
            r["iteration_rack_s"] = r["iteration_s"] / dilation
            r["predicted_iteration_rack_s"] = predicted[c]
            r["error"] = r["iteration_rack_s"] / predicted[c] - 1
        out[c] = {"runs": len(mine), "all_reduce_s": statistics.median(r["all_reduce_s"] for r in mine),
                  "iteration_rack_s": statistics.median(r["iteration_rack_s"] for r in mine),
                  "predicted_iteration_rack_s": predicted[c]}
    ring, agg = out["ring"], out["aggregate"]
    errors = [r["error"] for r in runs]
    out.update(
        all_reduce_speedup=ring["all_reduce_s"] / agg["all_reduce_s"],
        iteration_speedup=ring["iteration_rack_s"] / agg["iteration_rack_s"],
        predicted_iteration_speedup=predicted["ring"] / predicted["aggregate"],
        worst_error=max(errors, key=abs),
        checks={"all_reduce_at_least_bar": ring["all_reduce_s"] / agg["all_reduce_s"] >= bar,
                "every_run_within_tolerance": all(abs(e) <= tolerance for e in errors),
                "exact_sums": all(r["exact_sums"] for r in runs),
                "ran_as_asked": all(r["collective_run"] == r["collective"] for r in runs)},
        bar=bar, tolerance=tolerance)
    return out


def order(repeats: int) -> list[str]:
    """ring, aggregate, then aggregate, ring, ...: each collective first in half the pairs."""
    return [c for i in range(repeats) for c in (COLLECTIVES if i % 2 == 0 else COLLECTIVES[::-1])]


# --- the simulator's prediction ------------------------------------------------------------------------------
def predict(rack, gpus: list[str], model: str, iterations: int) -> tuple[dict[str, float], str]:
    """The simulator's mean iteration time (rack seconds) of the job alone on `rack`, ring (regroup) and
    aggregate (panama), and the calibration's source."""
    from evidence import records as rec
    from evidence.report import engine as report_engine
    from simulator.inputs.workloads import JobSpec
    from simulator.model import calibration, neighbours
    from simulator.model.engine import Options, policies

    whole = report_engine.current(rec.load())
    cal = calibration.from_record(whole[-1].data if whole else None)
    source = cal.source + (f" ({whole[-1].path.name})" if whole else "")
    job = JobSpec("bench", 0.0, len(gpus), model, iterations, tuple(gpus))
    options = Options(net=cal.net(rack), step_model="exact")
    out = {}
    for c, policy in (("ring", policies(300.0)["regroup"]), ("aggregate", neighbours.policies()["panama"])):
        out[c] = neighbours.run_class(policy)(rack, [job], policy, options).run().jobs[0].mean_iteration_s
    return out, source


# --- the rack -----------------------------------------------------------------------------------------------
def run_job(client, gpus: list[str], collective: str, workload: dict, timeout: float) -> dict:
    """Submit one job of `workload` on `gpus` with `collective`, wait for its end and gather its workers' lines; its
    figures (run_figures), and every line by GPU under "lines"."""
    job = client.post("/jobs", {"gpus": gpus, "collective": collective, "policy": "regroup", "queue": False,
                                "checkpoint_every": workload["iterations"] + 1, "warm_spares": 0,
                                "workload": workload})["job"]
    deadline, seen = time.monotonic() + timeout, {}
    while True:  # the controller serves each worker's last lines (heartbeats among them): gather them as they come
        now = client.get(f"/jobs/{job['id']}")["job"]
        gather(seen, client.get(f"/jobs/{job['id']}/logs")["logs"])
        if now["state"] in ENDED:
            break
        if time.monotonic() > deadline:
            client.delete(f"/jobs/{job['id']}")
            raise RuntimeError(f"job {job['id']} ({collective}) did not end within {timeout:g} s")
        time.sleep(0.25)
    if now["state"] != "done":
        raise RuntimeError(f"job {job['id']} ({collective}) ended {now['state']}: {now.get('reason')}")
    lines = {g: [json.loads(x) for x in xs] for g, xs in seen.items()}
    return {"collective": collective, "job": now["id"], "switches": now["switches"],
            "aggregation": now.get("aggregation"), **run_figures(lines), "lines": lines}


def cable(tb, rack, switch: str, gpus: list[str]) -> None:
    """Put `gpus` under `switch` by the OCS (the other circuits kept), so that the job is placed there as it is."""
    try:
        from scripts.bench_allreduce import ring_circuits
    except ModuleNotFoundError:
        from bench_allreduce import ring_circuits

    circuits = ring_circuits(rack, switch, gpus)
    ours = {q for c in circuits for q in c}
    kept = [c for c in tb.client.get("/ocs/circuits")["circuits"] if not set(c) & ours]
    tb.client.put("/ocs/circuits", {"circuits": kept + circuits})


def main(argv: list[str] | None = None) -> int:
    from controller.core.rack import load_rack
    from emulation.harness import Testbed

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topo", type=Path, default=ROOT / "topologies" / "paper-testbed.yaml")
    p.add_argument("--gpus", default="gpu1,gpu2,gpu3,gpu4", help="the job's GPUs (default %(default)s)")
    p.add_argument("--model", choices=["vgg16", "resnet50"], default="vgg16")
    p.add_argument("--repeats", type=int, default=5, help="runs of each collective (default %(default)s)")
    p.add_argument("--iterations", type=int, default=12, help="iterations per run (default %(default)s)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take (default %(default)s)")
    add_json_option(p)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.iterations < 2:
        p.error("--repeats must be at least 1 and --iterations at least 2")
    rack = load_rack(args.topo)
    gpus = args.gpus.split(",")
    unknown = sorted(set(gpus) - set(rack.gpus))
    if unknown or len(set(gpus)) != len(gpus) or len(gpus) < 2:
        p.error(f"--gpus: 2 or more distinct GPUs of {args.topo.name}" + (f" (unknown: {', '.join(unknown)})"
                                                                          if unknown else ""))
    from controller.core.aggregators import aggregators

    if not aggregators(rack):
        p.error(f"{args.topo.name}: no switch with an in-network aggregator")
    switch = aggregators(rack)[0].switch
    predicted, source = predict(rack, gpus, args.model, args.iterations)
    print(f"simulator ({source}): ring {predicted['ring']:.3f} s, aggregate {predicted['aggregate']:.3f} s "
          "per iteration (rack seconds)", flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp, Testbed(rack, args.topo, Path(tmp)) as tb:
        cable(tb, rack, switch, gpus)
        for i, collective in enumerate(order(args.repeats)):
            r = run_job(tb.client, gpus, collective, {"model": args.model, "iterations": args.iterations},
                        args.timeout)
            del r["lines"]
            if r["switches"] != [switch]:
                raise RuntimeError(f"run {i + 1} ({collective}) placed under {r['switches']}, not {switch}")
            runs.append(r)
            print(f"  run {i + 1}/{2 * args.repeats} {collective:9s}: all-reduce {r['all_reduce_s']:.3f} s, "
                  f"iteration {r['iteration_s']:.3f} s (emulated; median of {r['iterations']}), "
                  f"sums exact: {r['exact_sums']}, ran as {r['collective_run']}", flush=True)
    dilation = rack.spec.emulation.time_dilation
    s = summarise(runs, dilation, predicted)
    for c in COLLECTIVES:
        print(f"{c:9s}: all-reduce {s[c]['all_reduce_s']:.3f} s (emulated), iteration {s[c]['iteration_rack_s']:.3f} s "
              f"(rack), simulated {s[c]['predicted_iteration_rack_s']:.3f} s (median of {s[c]['runs']} runs)")
    print(f"aggregate over ring: all-reduce {s['all_reduce_speedup']:.2f}x (bar {s['bar']:g}x), iteration "
          f"{s['iteration_speedup']:.2f}x (simulated {s['predicted_iteration_speedup']:.2f}x); worst run against "
          f"the simulator {100 * s['worst_error']:+.1f} %; checks: {s['checks']}")
    write_json(args.json, {"rack": rack.name, "gpus": gpus, "switch": switch, "model": args.model,
                           "iterations": args.iterations, "time_dilation": dilation, "simulator": source,
                           "runs": runs, "summary": s})
    return 0


if __name__ == "__main__":
    sys.exit(main())

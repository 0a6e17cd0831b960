#!/usr/bin/env python3
"""Check: does a model train the same when its gradients are summed at the in-network aggregator as around the ring?
One job of the worker's real mode on the emulated paper rack, submitted through the controller's REST API.

The rack and a controller are brought up and the job's GPUs (default gpu1-gpu4) are cabled under the switch of the
first aggregator (as1 on the paper rack) by the OCS, as scripts/bench_aggregate.py does. Then the same job is run
once per entry of --order (default ring, aggregate, ring), one at a time: the worker's real mode (a small VGG-style
CNN on CPU torch, 814,122 parameters: a 3.26 MB gradient, --batch images of 3x32x32 per rank and iteration; the same
initial weights and the same data in every run, since every rank seeds its weights and each iteration's data alike).
Each run keeps every rank's loss and gradient norm (of the averaged gradient) per iteration, the collective its start
lines say it ran, whether the replicas ended equal (the worker compares them), and its median all-reduce time.

Every run is compared with the first ring run: per rank and iteration the relative difference of the loss and of
the gradient norm, and its largest value. The bar is float tolerance, 1e-5 relative (--tolerance): the aggregator
sums in double precision and rounds once, the ring adds float32 partial sums in its own order, so the sums differ in
their last bits and those differences go on through the updates. A second ring run shows what the ring gives
against itself. Needs root and the worker image; for a record, run it with nothing else running on the machine:

    python -m scripts.aggregate_losses --json results/bench/<UTC>-<commit>-aggregate_losses.json
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    from scripts.bench_aggregate import COLLECTIVES, cable, run_job
    from scripts.stats import add_json_option, write_json
except ModuleNotFoundError:  # run as a file: scripts/ itself is on sys.path
    from bench_aggregate import COLLECTIVES, cable, run_job
    from stats import add_json_option, write_json

FIELDS = ("loss", "grad_norm")


# --- pure parts (tests/unit/test_bench_aggregate.py) ----------------------------------------------------------
def per_iteration(lines: dict[str, list[dict]]) -> dict[str, dict[int, dict[str, float]]]:
    """GPU -> iteration -> its loss and gradient norm, from each worker's iteration lines."""
    out = {}
    for gpu, records in lines.items():
        out[gpu] = {r["iteration"]: {f: r[f] for f in FIELDS} for r in records if r.get("event") == "iteration"}
    return out


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def compare(reference: dict, other: dict) -> dict:
    """The largest relative difference of each field between two runs' per_iteration figures, over every rank and
    iteration both have, and what one has that the other has not ("unmatched": GPU:iteration)."""
    both = [(g, i) for g in sorted(reference) for i in sorted(reference[g]) if i in other.get(g, {})]
    unmatched = sorted({f"{g}:{i}" for x, y in ((reference, other), (other, reference)) for g in x for i in x[g]
                        if i not in y.get(g, {})})
    if not both:
        raise ValueError("the runs have no rank and iteration in common")
    out: dict = {"compared": len(both), "unmatched": unmatched}
    for f in FIELDS:
        diffs = [relative(reference[g][i][f], other[g][i][f]) for g, i in both]
        out[f"{f}_max_relative"] = max(diffs)
        out[f"{f}_identical"] = sum(d == 0 for d in diffs)
    return out


def summarise(runs: list[dict], tolerance: float = 1e-5) -> dict:
    """Each run against the first ring run (its `against_ring`), the largest differences of the aggregate runs and
    of the other ring runs, and what holds: every aggregate run within `tolerance` on every rank and iteration, with
    every iteration of the reference, every run the collective it asked for and its replicas equal at its end."""
    rings = [r for r in runs if r["collective"] == "ring"]
    if not rings or not any(r["collective"] == "aggregate" for r in runs):
        raise ValueError("the losses are compared with a ring run and an aggregate run at least")
    reference = per_iteration(rings[0]["lines"])
    for r in runs:
        r["against_ring"] = None if r is rings[0] else compare(reference, per_iteration(r["lines"]))
    out: dict = {"tolerance": tolerance, "reference": rings[0]["job"]}
    for c in COLLECTIVES:
        mine = [r["against_ring"] for r in runs if r["collective"] == c and r["against_ring"] is not None]
        out[c] = {f"{f}_max_relative": max((m[f"{f}_max_relative"] for m in mine), default=None) for f in FIELDS}
        out[c]["runs"] = len(mine)
    aggs = [r["against_ring"] for r in runs if r["collective"] == "aggregate"]
    out["checks"] = {
        "aggregate_within_tolerance": all(a[f"{f}_max_relative"] <= tolerance for a in aggs for f in FIELDS),
        "every_iteration_compared": all(not r["against_ring"]["unmatched"] for r in runs if r["against_ring"]),
        "ran_as_asked": all(r["collective_run"] == r["collective"] for r in runs),
        "replicas_equal": all(r["exact_sums"] for r in runs)}
    return out


# --- the rack -----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from controller.core.aggregators import aggregators
    from controller.core.rack import load_rack
    from emulation.harness import Testbed

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topo", type=Path, default=ROOT / "topologies" / "paper-testbed.yaml")
    p.add_argument("--gpus", default="gpu1,gpu2,gpu3,gpu4", help="the job's GPUs (default %(default)s)")
    p.add_argument("--order", default="ring,aggregate,ring",
                   help="the runs' collectives in order, the first ring the reference (default %(default)s)")
    p.add_argument("--iterations", type=int, default=30, help="iterations per run (default %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="images per rank and iteration (default %(default)s)")
    p.add_argument("--tolerance", type=float, default=1e-5, help="the bar, relative (default %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take (default %(default)s)")
    add_json_option(p)
    args = p.parse_args(argv)
    order = args.order.split(",")
    if set(order) - set(COLLECTIVES) or "ring" not in order or "aggregate" not in order:
        p.error(f"--order: ring and aggregate, comma-separated, each at least once, not {args.order!r}")
    if args.iterations < 1 or args.batch < 1 or not 0 < args.tolerance < 1:
        p.error("--iterations and --batch must be at least 1, --tolerance between 0 and 1")
    rack = load_rack(args.topo)
    gpus = args.gpus.split(",")
    unknown = sorted(set(gpus) - set(rack.gpus))
    if unknown or len(set(gpus)) != len(gpus) or len(gpus) < 2:
        p.error(f"--gpus: 2 or more distinct GPUs of {args.topo.name}" + (f" (unknown: {', '.join(unknown)})"
                                                                          if unknown else ""))
    if not aggregators(rack):
        p.error(f"{args.topo.name}: no switch with an in-network aggregator")
    switch = aggregators(rack)[0].switch
    workload = {"mode": "real", "iterations": args.iterations, "batch": args.batch}
    runs = []
    with tempfile.TemporaryDirectory() as tmp, Testbed(rack, args.topo, Path(tmp)) as tb:
        cable(tb, rack, switch, gpus)
        for i, collective in enumerate(order):
            r = run_job(tb.client, gpus, collective, workload, args.timeout)
            if r["switches"] != [switch]:
                raise RuntimeError(f"run {i + 1} ({collective}) placed under {r['switches']}, not {switch}")
            runs.append(r)
            print(f"  run {i + 1}/{len(order)} {collective:9s}: {r['iterations'] + 1} iterations, all-reduce "
                  f"{r['all_reduce_s']:.3f} s, iteration {r['iteration_s']:.3f} s (medians), ran as "
                  f"{r['collective_run']}, replicas equal: {r['exact_sums']}", flush=True)
    s = summarise(runs, args.tolerance)
    for r in runs[1:]:
        a = r["against_ring"]
        print(f"  {r['job']} ({r['collective']}) against {s['reference']} (ring): loss {a['loss_max_relative']:.2e}, "
              f"gradient norm {a['grad_norm_max_relative']:.2e} at most (relative; {a['compared']} rank-iterations, "
              f"{a['loss_identical']} losses identical)")
    print(f"checks: {s['checks']}")
    for r in runs:  # the per-iteration figures stay; the rest of the lines go
        r["per_iteration"] = per_iteration(r.pop("lines"))
    write_json(args.json, {"rack": rack.name, "gpus": gpus, "switch": switch, "workload": workload,
                           "model": "the worker's real mode: small VGG-style CNN, 814,122 parameters (a 3.26 MB "
                                    "gradient), CPU torch",
                           "order": order, "runs": runs, "summary": s})
    return 0 if all(s["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

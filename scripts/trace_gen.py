"""The trace of the simulator's trace check: jobs of 1-8 GPUs arriving faster than the rack can run
them, so that a queue forms; written as the simulator's CSV trace (`optirack simulate --trace`), which
scripts/replay_trace.py submits to the emulated rack at the same arrival times.

    python -m scripts.trace_gen --seed 35 --jobs 40 --out traces/trace16.csv

Everything comes from the seed: sizes drawn from SIZES, workloads from MODELS, iterations log-uniform in
ITERATIONS, arrivals a Poisson process whose rate offers LOAD times the rack's GPU-seconds over the arrival
span (each job's GPU-seconds estimated as GPUs x iterations x EST_ITERATION_S). Times in rack seconds.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

SIZES = {1: 0.2, 2: 0.3, 3: 0.05, 4: 0.25, 6: 0.05, 8: 0.15}  # GPUs: probability
MODELS = {"vgg16": 0.6, "resnet50": 0.4}  # vgg16: communication-heavy, where placement matters
ITERATIONS = (30, 120)
EST_ITERATION_S = 0.25  # rack seconds, a rough mean over the rack's two GPU models and the two workloads
LOAD = 1.3  # offered load over the arrival span: above 1, so a queue forms
RACK_GPUS = 16


def generate(seed: int, jobs: int, load: float = LOAD, gpus: int = RACK_GPUS) -> list[dict]:
    """`jobs` jobs: {arrival_s, gpus, model, iterations}, by arrival."""
    if not 1 <= jobs <= 10_000:
        raise ValueError(f"--jobs must be between 1 and 10000, not {jobs}")
    if not load > 0:
        raise ValueError(f"--load must be positive, not {load}")
    rng = random.Random(seed)
    out = []
    for _ in range(jobs):
        size = rng.choices(list(SIZES), weights=list(SIZES.values()))[0]
        model = rng.choices(list(MODELS), weights=list(MODELS.values()))[0]
        lo, hi = ITERATIONS
        iterations = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        out.append({"gpus": min(size, gpus), "model": model, "iterations": iterations})
    work = sum(j["gpus"] * j["iterations"] * EST_ITERATION_S for j in out)
    rate = jobs / (work / (gpus * load))  # arrivals per rack second
    t = 0.0
    for j in out:
        j["arrival_s"] = round(t, 1)
        t += rng.expovariate(rate)
    return out


def csv_text(jobs: list[dict], seed: int, load: float) -> str:
    head = [f"# The trace check's trace: python -m scripts.trace_gen --seed {seed} --jobs {len(jobs)} "
            f"--load {load:g}",
            "# For topologies/trace16.yaml (16 GPUs); replayed by scripts/replay_trace.py, simulated by",
            "#   optirack simulate --rack topologies/trace16.yaml --trace traces/trace16.csv",
            "arrival_s,gpus,model,iterations"]
    return "\n".join(head + [f"{j['arrival_s']:g},{j['gpus']},{j['model']},{j['iterations']}" for j in jobs]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.trace_gen", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--load", type=float, default=LOAD)
    ap.add_argument("--out", type=Path, help="write here (default: print)")
    args = ap.parse_args(argv)
    try:
        jobs = generate(args.seed, args.jobs, args.load)
    except ValueError as exc:
        print(f"trace_gen: {exc}", file=sys.stderr)
        return 2
    text = csv_text(jobs, args.seed, args.load)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

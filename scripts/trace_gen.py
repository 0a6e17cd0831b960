"""The traces of the simulator's trace check: jobs of 1-8 GPUs arriving at a rate that offers a chosen load of
the rack's GPU-seconds; written as the simulator's CSV trace (`optirack simulate --trace`), which
scripts/replay_trace.py submits to the emulated rack at the same arrival times.

    python -m scripts.trace_gen --seed 35 --jobs 40 --out traces/trace16.csv
    python -m scripts.trace_gen --seed 48 --jobs 24 --sizes 4:0.3,8:0.3,2:0.2,6:0.2 --arrivals bursty ...

Everything comes from the seed: sizes drawn from --sizes (default SIZES), workloads from --models (MODELS),
iterations log-uniform in --iterations (ITERATIONS), arrivals whose rate offers --load (LOAD) times the rack's
GPU-seconds over the arrival span (each job's GPU-seconds estimated as GPUs x iterations x EST_ITERATION_S):
`poisson` (exponential gaps), `bursty` (bursts of --burst jobs within BURST_SPREAD_S, the bursts' gaps
exponential, at the same mean rate) or `even` (equal gaps, each jittered by up to a quarter of a gap). Every
option other than its default is written in the trace's first line, so the line remakes it. Times in rack seconds.
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
ARRIVALS = ("poisson", "bursty", "even")
BURST = 4  # jobs per burst (bursty)
BURST_SPREAD_S = 2.0  # rack seconds a burst's arrivals spread over (bursty)


def shares(text: str, what: str, key=str) -> dict:
    """`A:0.5,B:0.5` as {A: 0.5, B: 0.5}: positive weights (they need not sum to 1)."""
    out = {}
    for part in text.split(","):
        name, _, weight = part.partition(":")
        try:
            k, w = key(name.strip()), float(weight)
        except ValueError:
            raise ValueError(f"--{what}: {part!r} is not NAME:WEIGHT") from None
        if not w > 0 or k in out:
            raise ValueError(f"--{what}: {part!r}: a weight must be positive, each name given once")
        out[k] = w
    return out


def generate(seed: int, jobs: int, load: float = LOAD, gpus: int = RACK_GPUS, sizes: dict | None = None,
             models: dict | None = None, iterations: tuple[int, int] = ITERATIONS, arrivals: str = "poisson",
             burst: int = BURST) -> list[dict]:
    """`jobs` jobs: {arrival_s, gpus, model, iterations}, by arrival."""
    from profiles import WORKLOADS

    sizes, models = sizes or SIZES, models or MODELS
    if not 1 <= jobs <= 10_000:
        raise ValueError(f"--jobs must be between 1 and 10000, not {jobs}")
    if not load > 0:
        raise ValueError(f"--load must be positive, not {load}")
    if any(not 1 <= s <= gpus for s in sizes):
        raise ValueError(f"--sizes: every size must be 1 to {gpus} GPUs, not {sorted(sizes)}")
    if set(models) - set(WORKLOADS):
        raise ValueError(f"--models: {sorted(set(models) - set(WORKLOADS))} not among {sorted(WORKLOADS)}")
    if not 1 <= iterations[0] <= iterations[1]:
        raise ValueError(f"--iterations must be LO:HI with 1 <= LO <= HI, not {iterations}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"--arrivals must be one of {', '.join(ARRIVALS)}, not {arrivals!r}")
    if burst < 2:
        raise ValueError(f"--burst must be 2 or more, not {burst}")
    rng = random.Random(seed)
    out = []
    for _ in range(jobs):
        size = rng.choices(list(sizes), weights=list(sizes.values()))[0]
        model = rng.choices(list(models), weights=list(models.values()))[0]
        lo, hi = iterations
        n = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        out.append({"gpus": min(size, gpus), "model": model, "iterations": n})
    work = sum(j["gpus"] * j["iterations"] * EST_ITERATION_S for j in out)
    rate = jobs / (work / (gpus * load))  # arrivals per rack second
    t = start = 0.0
    for i, j in enumerate(out):
        if arrivals == "bursty":  # a burst's jobs within BURST_SPREAD_S, then a gap of `burst` mean arrivals
            first = i % burst == 0
            if first and i:
                t = start + rng.expovariate(rate / burst)
            if first:
                start = t
            j["arrival_s"] = round(start + (0.0 if first else rng.uniform(0, BURST_SPREAD_S)), 1)
            continue
        j["arrival_s"] = round(t, 1)
        t += rng.expovariate(rate) if arrivals == "poisson" else (1 + rng.uniform(-0.25, 0.25)) / rate
    out.sort(key=lambda j: j["arrival_s"])
    return out


def csv_text(jobs: list[dict], seed: int, load: float, options: str = "", name: str = "trace16.csv") -> str:
    head = [f"# The trace check's trace: python -m scripts.trace_gen --seed {seed} --jobs {len(jobs)} "
            f"--load {load:g}{options}",
            "# For topologies/trace16.yaml (16 GPUs); replayed by scripts/replay_trace.py, simulated by",
            f"#   optirack simulate --rack topologies/trace16.yaml --trace traces/{name}",
            "arrival_s,gpus,model,iterations"]
    return "\n".join(head + [f"{j['arrival_s']:g},{j['gpus']},{j['model']},{j['iterations']}" for j in jobs]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.trace_gen", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--load", type=float, default=LOAD)
    ap.add_argument("--sizes", help="GPUs per job and their weights, e.g. 1:0.4,2:0.4,4:0.2 (default: "
                    + ",".join(f"{k}:{v:g}" for k, v in SIZES.items()) + ")")
    ap.add_argument("--models", help="workloads and their weights (default: "
                    + ",".join(f"{k}:{v:g}" for k, v in MODELS.items()) + ")")
    ap.add_argument("--iterations", help=f"LO:HI, iterations log-uniform between (default: {ITERATIONS[0]}:"
                    f"{ITERATIONS[1]})")
    ap.add_argument("--arrivals", default="poisson", help=f"{', '.join(ARRIVALS)} (%(default)s)")
    ap.add_argument("--burst", type=int, default=BURST, help="jobs per burst, with --arrivals bursty (%(default)s)")
    ap.add_argument("--out", type=Path, help="write here (default: print)")
    args = ap.parse_args(argv)
    options = "".join(f" --{k} {v}" for k, v in (("sizes", args.sizes), ("models", args.models),
                                                  ("iterations", args.iterations)) if v)
    options += "" if args.arrivals == "poisson" else f" --arrivals {args.arrivals}"
    options += f" --burst {args.burst}" if args.arrivals == "bursty" else ""
    try:
        lo_hi = args.iterations.split(":") if args.iterations else ITERATIONS
        if len(lo_hi) != 2:
            raise ValueError(f"--iterations must be LO:HI, not {args.iterations!r}")
        try:
            its = (int(lo_hi[0]), int(lo_hi[1]))
        except ValueError:
            raise ValueError(f"--iterations must be LO:HI in whole numbers, not {args.iterations!r}") from None
        jobs = generate(args.seed, args.jobs, args.load,
                        sizes=shares(args.sizes, "sizes", int) if args.sizes else None,
                        models=shares(args.models, "models") if args.models else None,
                        iterations=its, arrivals=args.arrivals, burst=args.burst)
    except ValueError as exc:
        print(f"trace_gen: {exc}", file=sys.stderr)
        return 2
    text = csv_text(jobs, args.seed, args.load, options, args.out.name if args.out else "trace16.csv")
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the simulated cluster runs: the paper's two cases, a synthetic mix, or a CSV trace.

Synthetic jobs (`synthetic`), all drawn from one seeded generator:
- arrivals: a Poisson process whose rate offers `load` x the cluster's GPUs in GPU-seconds
  (each job's GPU-seconds estimated as GPUs x iterations x its iteration time alone under one switch);
- sizes: 2^k GPUs, k = 0..7 (1 to 128 GPUs) with weights SIZE_WEIGHTS, never more than the rack has;
- models: vgg16 or resnet50 with weights MODEL_WEIGHTS (profiles in containers/profiles.py);
- iterations: log-uniform between ITERATIONS[0] and ITERATIONS[1].

A CSV trace has the header `arrival_s,gpus,model,iterations`, one job per line; `#` starts a comment.
"""
from __future__ import annotations

import csv
import importlib.util
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from containers.profiles import WORKLOADS

SIZE_WEIGHTS = (0.20, 0.20, 0.20, 0.15, 0.10, 0.08, 0.05, 0.02)  # 1, 2, 4, ..., 128 GPUs
MODEL_WEIGHTS = (("vgg16", 0.6), ("resnet50", 0.4))
ITERATIONS = (100, 5000)
TRACE_FIELDS = ("arrival_s", "gpus", "model", "iterations")


@dataclass(frozen=True)
class JobSpec:
    id: str
    arrival_s: float
    gpus: int
    model: str  # a workload of containers/profiles.py
    iterations: int
    names: tuple[str, ...] = ()  # the GPUs it asks for by name (the paper's cases), else any
    policy: str = ""  # a placement policy it keeps whatever the run's (the paper's job beside)
    label: str = ""
    stops_with: str = ""  # stopped when this job ends (the demo stops the job beside with the job of concern)


class TraceError(ValueError):
    """A trace line that cannot be used; the message names the file, line and field."""


def read_trace(path: str | Path, max_gpus: int | None = None) -> list[JobSpec]:
    """Parse a CSV trace, or raise TraceError naming the line and the field at fault."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from None
    lines = [
        (i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip() and not line.lstrip().startswith("#")
    ]
    if not lines:
        raise TraceError(f"{path}: no header; the first line must be {','.join(TRACE_FIELDS)}")
    header_no, header = lines[0]
    names = [h.strip() for h in next(csv.reader([header]))]
    if names != list(TRACE_FIELDS):
        raise TraceError(f"{path}: line {header_no}: header is {','.join(names)!r}; expected {','.join(TRACE_FIELDS)}")
    jobs = []
    for no, line in lines[1:]:
        row = [x.strip() for x in next(csv.reader([line]))]
        if len(row) != len(TRACE_FIELDS):
            raise TraceError(
                f"{path}: line {no}: {len(row)} fields, expected {len(TRACE_FIELDS)} ({','.join(TRACE_FIELDS)})"
            )
        jobs.append(_trace_job(path, no, dict(zip(TRACE_FIELDS, row, strict=True)), len(jobs), max_gpus))
    if not jobs:
        raise TraceError(f"{path}: no jobs after the header")
    return sorted(jobs, key=lambda j: (j.arrival_s, int(j.id[1:])))


def _trace_job(path: Path, no: int, row: dict[str, str], index: int, max_gpus: int | None) -> JobSpec:
    def bad(field: str, problem: str) -> TraceError:
        return TraceError(f"{path}: line {no}: {field}: {problem}")

    try:
        arrival = float(row["arrival_s"])
    except ValueError:
        raise bad("arrival_s", f"{row['arrival_s']!r} is not a number of seconds") from None
    if not math.isfinite(arrival) or arrival < 0:
        raise bad("arrival_s", f"{row['arrival_s']} must be a finite number >= 0")
    for field in ("gpus", "iterations"):
        if not row[field].isdigit() or int(row[field]) < 1:
            raise bad(field, f"{row[field]!r} is not a positive integer")
    gpus = int(row["gpus"])
    if max_gpus is not None and gpus > max_gpus:
        raise bad("gpus", f"{gpus} GPUs asked for; the rack has {max_gpus}")
    if row["model"] not in WORKLOADS:
        raise bad("model", f"unknown model {row['model']!r} (known: {', '.join(sorted(WORKLOADS))})")
    return JobSpec(f"j{index + 1}", arrival, gpus, row["model"], int(row["iterations"]))


def synthetic(jobs: int, seed: int, rack_gpus: int, iteration_s: dict[str, float], load: float = 0.9) -> list[JobSpec]:
    """`jobs` jobs drawn as the module docstring says; `iteration_s`: model -> a rough iteration time."""
    if jobs < 1:
        raise ValueError("--jobs must be at least 1")
    if load <= 0:
        raise ValueError("--load must be positive")
    rng = random.Random(seed)
    sizes = [2**k for k in range(len(SIZE_WEIGHTS)) if 2**k <= rack_gpus]
    weights = SIZE_WEIGHTS[: len(sizes)]
    models, model_weights = zip(*MODEL_WEIGHTS, strict=True)
    lo, hi = map(math.log, ITERATIONS)
    drawn = []
    for _ in range(jobs):
        n = rng.choices(sizes, weights)[0]
        model = rng.choices(models, model_weights)[0]
        iterations = max(1, round(math.exp(rng.uniform(lo, hi))))
        drawn.append((n, model, iterations))
    work = sum(n * it * iteration_s[m] for n, m, it in drawn) / jobs  # GPU-seconds per job
    rate = load * rack_gpus / work  # jobs per second
    t, out = 0.0, []
    for i, (n, model, iterations) in enumerate(drawn):
        out.append(JobSpec(f"j{i + 1}", round(t, 6), n, model, iterations))
        t += rng.expovariate(rate)
    return out


def _demo():
    """scripts/paper_experiment.py, imported as a module, or loaded from this checkout when `scripts`
    is not importable (the console script does not run from the repository)."""
    try:
        import scripts.paper_experiment as demo
    except ModuleNotFoundError:
        path = Path(__file__).resolve().parents[1] / "scripts" / "paper_experiment.py"
        spec = importlib.util.spec_from_file_location("optirack_paper_experiment", path)
        if spec is None or not path.exists():
            raise RuntimeError(f"--case needs the demo's definition of the cases, {path}, which is missing") from None
        demo = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = demo  # dataclasses look their module up there
        spec.loader.exec_module(demo)
    return demo


def paper_case(name: str, iterations: int = 60, model: str = "vgg16", beside_factor: int = 20) -> list[JobSpec]:
    """The demo's case: its job of concern and the job beside it, both at t = 0, named GPUs.

    The job beside runs `beside_factor` times as many iterations, so that it runs for the job of
    concern's whole run, as in scripts/paper_experiment.py (which stops it when the first ends).
    """
    CASES = _demo().CASES  # the demo's own definition of the cases
    if name not in CASES:
        raise ValueError(f"--case: unknown case {name!r} (cases: {', '.join(CASES)})")
    case = CASES[name]
    return [
        JobSpec("concern", 0.0, len(case.concern), model, iterations, tuple(case.concern), label="job of concern"),
        JobSpec(
            "beside",
            0.0,
            len(case.other),
            model,
            iterations * beside_factor,
            tuple(case.other),
            "fixed",
            label="job beside",
            stops_with="concern",
        ),
    ]

"""What the simulated cluster runs: the paper's two cases, a synthetic mix, or a CSV trace.

Synthetic jobs (`synthetic`), all drawn from one seeded generator:
- arrivals: a Poisson process whose rate offers `load` x the cluster's GPUs in GPU-seconds
  (each job's GPU-seconds estimated as GPUs x iterations x its iteration time alone under one switch);
- sizes: 2^k GPUs, k = 0..7 (1 to 128 GPUs) with weights SIZE_WEIGHTS, never more than the rack has;
- models: vgg16 or resnet50 with weights MODEL_WEIGHTS (profiles in profiles/__init__.py);
- iterations: log-uniform between ITERATIONS[0] and ITERATIONS[1].

A CSV trace has a header naming its columns, one job per line; `#` starts a comment. Columns:
`arrival_s`, `gpus`, `model` and one of `iterations` (run exactly that many) or `duration_s` (the
recorded run time: see `DURATION_MODES`); optionally `gpu_type` (a GPU model the job asks for).
Public traces (Philly, Helios/Acme, Alibaba PAI 2020) are read by simulator/inputs/traces.py.
"""
from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from profiles import GPU_MODELS
from simulator.inputs.cases import CASES
from simulator.model import models

SIZE_WEIGHTS = (0.20, 0.20, 0.20, 0.15, 0.10, 0.08, 0.05, 0.02)  # 1, 2, 4, ..., 128 GPUs
MODEL_WEIGHTS = (("vgg16", 0.6), ("resnet50", 0.4))
ITERATIONS = (100, 5000)
TRACE_FIELDS = ("arrival_s", "gpus", "model", "iterations")  # the original header; duration_s may replace iterations
OPTIONAL_FIELDS = ("gpu_type",)
MAX_ITERATIONS = 100_000_000  # more would run for years of simulated time: give a duration instead
MAX_DURATION_S = 366 * 86400.0
DURATION_MODES = {
    "derived": "iterations derived from the workload: the recorded duration over the job's iteration time alone "
    "on the GPUs it is given, so a job alone on the fabric keeps its recorded duration and sharing stretches it",
    "replayed": "the recorded duration replayed as is: the job holds its GPUs that long whatever the network "
    "(its traffic is not simulated)",
}


@dataclass(frozen=True)
class JobSpec:
    id: str
    arrival_s: float
    gpus: int
    model: str  # a workload of profiles/__init__.py
    iterations: int
    names: tuple[str, ...] = ()  # the GPUs it asks for by name (the paper's cases), else any
    policy: str = ""  # a placement policy it keeps whatever the run's (the paper's job beside)
    label: str = ""
    stops_with: str = ""  # stopped when this job ends (the demo stops the job beside with the job of concern)
    duration_s: float = 0.0  # recorded run time (iterations 0): see DURATION_MODES
    gpu_model: str = ""  # a GPU model it asks for (the trace's GPU type), else any
    source: str = ""  # where it was read: file:line (for messages)


class TraceError(ValueError):
    """A trace line that cannot be used; the message names the file, line and field."""


def read_text(path: str | Path) -> str:
    """A trace file's text, or TraceError naming the file: unreadable, binary or not UTF-8; a
    spreadsheet's byte-order mark is dropped."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from None
    if b"\0" in data[:65536]:
        raise TraceError(f"{path}: a binary file, not a text trace")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TraceError(f"{path}: line {line}: not UTF-8 text (byte {data[e.start]:#04x})") from None
    return text


def positive_int(text: str) -> int | None:
    """'12' -> 12; None for anything but ASCII digits (so '²', '1.5', '-3' are refused) or 0."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        return None
    return int(text)


def read_trace(path: str | Path, max_gpus: int | None = None) -> list[JobSpec]:
    """Parse a CSV trace, or raise TraceError naming the line and the field at fault.

    `max_gpus` is no longer checked here: jobs larger than the rack are skipped (or refused) by `fit`."""
    path = Path(path)
    text = read_text(path)
    lines = [
        (i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip() and not line.lstrip().startswith("#")
    ]
    expected = ",".join(TRACE_FIELDS)
    if not lines:
        raise TraceError(f"{path}: no header; the first line must be {expected} (or duration_s for iterations)")
    header_no, header = lines[0]
    names = [h.strip() for h in next(csv.reader([header]))]
    required = ["arrival_s", "gpus", "model"]
    counts = [n for n in ("iterations", "duration_s") if n in names]
    unknown = [n for n in names if n not in (*required, "iterations", "duration_s", *OPTIONAL_FIELDS)]
    missing = [n for n in required if n not in names]
    if unknown or missing or len(counts) != 1 or len(set(names)) != len(names):
        problem = (f"unknown column {unknown[0]!r}" if unknown else f"no {missing[0]} column" if missing
                   else "repeated column" if len(set(names)) != len(names)
                   else "give one of iterations and duration_s")
        raise TraceError(f"{path}: line {header_no}: header {','.join(names)!r}: {problem}; expected {expected} "
                         f"(duration_s may replace iterations; optional: {', '.join(OPTIONAL_FIELDS)})")
    jobs = []
    for no, line in lines[1:]:
        row = [x.strip() for x in next(csv.reader([line]))]
        if len(row) != len(names):
            raise TraceError(f"{path}: line {no}: {len(row)} fields, expected {len(names)} ({','.join(names)})")
        jobs.append(_trace_job(path, no, dict(zip(names, row, strict=True)), len(jobs)))
    if not jobs:
        raise TraceError(f"{path}: no jobs after the header")
    return sorted(jobs, key=lambda j: (j.arrival_s, int(j.id[1:])))


def _trace_job(path: Path, no: int, row: dict[str, str], index: int) -> JobSpec:
    def bad(field: str, problem: str) -> TraceError:
        return TraceError(f"{path}: line {no}: {field}: {problem}")

    try:
        arrival = float(row["arrival_s"])
    except ValueError:
        raise bad("arrival_s", f"{row['arrival_s']!r} is not a number of seconds") from None
    if not math.isfinite(arrival) or arrival < 0:
        raise bad("arrival_s", f"{row['arrival_s']} must be a finite number >= 0")
    gpus = positive_int(row["gpus"])
    if gpus is None:
        raise bad("gpus", f"{row['gpus']!r} is not a positive integer")
    try:
        models.check(row["model"])
    except ValueError as e:
        raise bad("model", str(e)) from None
    iterations, duration = 0, 0.0
    if "iterations" in row:
        iterations = positive_int(row["iterations"])
        if iterations is None:
            raise bad("iterations", f"{row['iterations']!r} is not a positive integer")
        if iterations > MAX_ITERATIONS:
            raise bad("iterations", f"{iterations:,} is more than {MAX_ITERATIONS:,} (years of simulated time); "
                      "give the job's duration_s instead")
    else:
        duration = check_duration(row["duration_s"], lambda p: bad("duration_s", p))
    gpu_model = row.get("gpu_type", "")
    if gpu_model and gpu_model not in GPU_MODELS:
        raise bad("gpu_type", f"unknown GPU model {gpu_model!r} (known: {', '.join(GPU_MODELS)})")
    return JobSpec(f"j{index + 1}", arrival, gpus, row["model"], iterations, duration_s=duration,
                   gpu_model=gpu_model, source=f"{path}:{no}")


def check_duration(text: str, bad) -> float:
    try:
        duration = float(text)
    except ValueError:
        raise bad(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(duration) or duration <= 0:
        raise bad(f"{text} must be a positive number of seconds")
    if duration > MAX_DURATION_S:
        raise bad(f"{duration:,.0f} s is more than a year")
    return duration


@dataclass(frozen=True)
class Fitted:
    jobs: list[JobSpec]
    skipped: list[str]  # why each job left out was (one line each)
    types_dropped: int = 0  # jobs whose GPU type the rack lacks: placed on any GPU


def fit(jobs: list[JobSpec], rack_gpus: int, rack_models: set[str], strict: bool = False) -> Fitted:
    """Leave out jobs larger than the rack (counted; `strict`: refused with TraceError naming the first)."""
    kept, skipped, dropped = [], [], 0
    for j in jobs:
        if j.gpus > rack_gpus:
            why = f"{j.source or j.id}: gpus: {j.gpus} GPUs asked for; the rack has {rack_gpus}"
            if strict:
                raise TraceError(why + " (--strict refuses such a trace; without it such jobs are skipped)")
            skipped.append(why)
            continue
        if j.gpu_model and j.gpu_model not in rack_models:
            j = replace(j, gpu_model="")
            dropped += 1
        kept.append(j)
    if not kept:
        raise TraceError(f"no job of the trace fits the rack's {rack_gpus} GPUs ({len(skipped)} skipped)")
    return Fitted(kept, skipped, dropped)


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


def paper_case(name: str, iterations: int = 60, model: str = "vgg16", beside_factor: int = 20) -> list[JobSpec]:
    """The demo's case: its job of concern and the job beside it, both at t = 0, named GPUs.

    The job beside runs `beside_factor` times as many iterations, so that it runs for the job of
    concern's whole run, as in evidence/demo/experiment.py (which stops it when the first ends).
    """
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

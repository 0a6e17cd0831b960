"""Importers for the GPU-cluster traces people publish, into jobs by recorded duration.

Formats (the column names are those the trace projects publish):
- philly: msr-fiddle/philly-traces' `cluster_job_log`, a JSON list of jobs, each with `jobid`,
  `submitted_time` and `attempts` (each attempt `start_time`, `end_time` and `detail`, a list of
  machines with their `gpus`); times "YYYY-MM-DD HH:MM:SS". A job's GPUs: its first attempt's;
  its run time: from its first attempt's start to its last attempt's end.
- helios: S-Lab-System-Group/HeliosData's `cluster_log.csv`, and Acme's `trace_seren.csv` and
  `trace_kalos.csv` (InternLM/AcmeTrace), which name the same job columns: `job_id`, `gpu_num`,
  `submit_time` and `duration` (seconds) are used; jobs of 0 GPUs (CPU jobs) and jobs with no
  duration are left out and counted.
- pai: alibaba/clusterdata's cluster-trace-gpu-v2020 `pai_task_table.csv` (headerless upstream:
  job_name, task_name, inst_num, status, start_time, end_time, plan_cpu, plan_mem, plan_gpu,
  gpu_type), with the job table `pai_job_table.csv` (job_name, inst_id, user, status,
  start_time, end_time) beside it when there: a job's arrival is the job table's start_time
  (else its first task's), its run time from its first task's start to its last task's end, its
  GPUs the sum over tasks of inst_num x plan_gpu / 100 with each instance's fraction of a GPU
  rounded up to a whole GPU, its GPU type its tasks' (V100M32 read as V100; MISC as any).
- sacct: what Slurm's `sacct --parsable2` prints (JobID, Submit, Start, End and AllocTRES), a
  lab's own cluster's history; see simulator/inputs/sacct.py.

- lingjun: alibaba/alibaba-lingjun-dataset-2023, a folder of job.csv, worker.csv and topo.csv; its jobs name the
  GPUs they ran on, on the rack simulator/inputs/lingjun.py builds from topo.csv (its docstring).

Arrivals are made relative to the trace's first. A trace gives no model: every job runs `model`.
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from profiles import GPU_MODELS
from simulator.inputs import sacct
from simulator.inputs.workloads import JobSpec, TraceError, check_duration, read_text

FORMATS = ("csv", "philly", "helios", "pai", "sacct")
PAI_TASK = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time", "plan_cpu", "plan_mem",
            "plan_gpu", "gpu_type")
PAI_JOB = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
HELIOS_NEEDED = ("job_id", "gpu_num", "submit_time", "duration")
PAI_TYPES = {"V100M32": "V100"}
LINGJUN = "lingjun"  # alibaba/alibaba-lingjun-dataset-2023: a folder (simulator/inputs/lingjun.py), beside FORMATS


@dataclass
class Imported:
    jobs: list[JobSpec]
    left_out: Counter = field(default_factory=Counter)  # reason -> jobs
    fmt: str = "csv"


def detect(path: Path) -> str:
    """The format of a trace file by its name and first bytes."""
    name = path.name.lower()
    if path.is_dir():
        return LINGJUN  # a folder: the Lingjun trace's tables (simulator/inputs/lingjun.py)
    if name.endswith(".json") or name == "cluster_job_log":
        return "philly"
    if name.startswith("pai_task_table"):
        return "pai"
    try:
        head = path.open("rb").read(4096).decode("utf-8-sig", "replace").lstrip()
    except OSError:
        return "csv"  # read_trace names the error
    if head.startswith("["):
        return "philly"
    first = head.splitlines()[0] if head else ""
    if "gpu_num" in first and "submit_time" in first:  # Helios' and Acme's job logs
        return "helios"
    if sacct.is_sacct(first):
        return "sacct"
    return "csv"


def _time(text, path: Path, where: str, field_name: str) -> float:
    try:
        return datetime.strptime(str(text).strip(), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise TraceError(f"{path}: {where}: {field_name}: {text!r} is not a time YYYY-MM-DD HH:MM:SS") from None


def _finish(path: Path, raw: list[tuple[float, int, float, str, str]], left_out: Counter, fmt: str,
            model: str) -> Imported:
    """(arrival, gpus, duration, gpu type, source) -> jobs, arrivals from the first, in arrival order."""
    if not raw:
        reasons = "; ".join(f"{n} {why}" for why, n in left_out.most_common()) or "it is empty"
        raise TraceError(f"{path}: no job to replay in this {fmt} trace ({reasons})")
    first = min(a for a, *_ in raw)
    order = sorted(range(len(raw)), key=lambda i: (raw[i][0], i))
    jobs = [JobSpec(f"j{n + 1}", round(raw[i][0] - first, 6), raw[i][1], model, 0, duration_s=raw[i][2],
                    gpu_model=raw[i][3], source=raw[i][4]) for n, i in enumerate(order)]
    return Imported(jobs, left_out, fmt)


def philly(path: Path, model: str) -> Imported:
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: line {e.lineno}: not JSON: {e.msg}") from None
    if not isinstance(data, list):
        raise TraceError(f"{path}: a Philly cluster_job_log is a JSON list of jobs, not a {type(data).__name__}")
    raw, left = [], Counter()
    for n, job in enumerate(data):
        where = f"job {n + 1}" + (f" ({job.get('jobid')})" if isinstance(job, dict) and job.get("jobid") else "")
        if not isinstance(job, dict) or "submitted_time" not in job or "attempts" not in job:
            raise TraceError(f"{path}: {where}: not a Philly job (needs submitted_time and attempts)")
        attempts = [a for a in job["attempts"] or [] if isinstance(a, dict)]
        if not attempts or any(a.get("start_time") in (None, "None", "") for a in attempts[:1]) \
                or attempts[-1].get("end_time") in (None, "None", ""):
            left["never ran or never ended"] += 1
            continue
        gpus = sum(len(m.get("gpus") or []) for m in attempts[0].get("detail") or [])
        if gpus < 1:
            left["no GPU"] += 1
            continue
        submitted = _time(job["submitted_time"], path, where, "submitted_time")
        start = _time(attempts[0]["start_time"], path, where, "attempts[0].start_time")
        end = _time(attempts[-1]["end_time"], path, where, "attempts[-1].end_time")
        if end <= start:
            left["no run time"] += 1
            continue
        duration = check_duration(str(end - start), lambda p, w=where: TraceError(f"{path}: {w}: run time: {p}"))
        raw.append((submitted, gpus, duration, "", f"{path}:{where}"))
    return _finish(path, raw, left, "philly", model)


def _rows(path: Path, text: str, header: tuple[str, ...] | None, needed: tuple[str, ...]):
    """(line number, dict) per row; `header` when the file has none (its first row is data)."""
    reader = csv.reader(io.StringIO(text))
    rows = [(reader.line_num, r) for r in reader if r and any(c.strip() for c in r)]
    if not rows:
        raise TraceError(f"{path}: empty")
    first = [c.strip() for c in rows[0][1]]
    if all(n in first for n in needed):
        names, rows = first, rows[1:]
    elif header is not None and len(first) == len(header):
        names = list(header)
    else:
        missing = [n for n in needed if n not in first]
        raise TraceError(f"{path}: line {rows[0][0]}: header lacks {', '.join(missing)} (needs {', '.join(needed)})")
    for no, r in rows:
        if len(r) != len(names):
            raise TraceError(f"{path}: line {no}: {len(r)} fields, expected {len(names)} ({','.join(names)})")
        yield no, dict(zip(names, (c.strip() for c in r), strict=True))


def _number(path: Path, no: int, row: dict, name: str) -> float:
    try:
        value = float(row[name])
    except ValueError:
        raise TraceError(f"{path}: line {no}: {name}: {row[name]!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{path}: line {no}: {name}: {row[name]} must be a finite number >= 0")
    return value


def helios(path: Path, model: str) -> Imported:
    raw, left = [], Counter()
    for no, row in _rows(path, read_text(path), None, HELIOS_NEEDED):
        where = f"line {no}"
        gpus = _number(path, no, row, "gpu_num")
        if gpus != int(gpus):
            raise TraceError(f"{path}: {where}: gpu_num: {row['gpu_num']!r} is not a whole number of GPUs")
        if gpus < 1:
            left["no GPU (CPU jobs)"] += 1
            continue
        if not row["duration"] or _number(path, no, row, "duration") <= 0:
            left["no run time"] += 1
            continue
        duration = check_duration(row["duration"], lambda p, w=where: TraceError(f"{path}: {w}: duration: {p}"))
        raw.append((_time(row["submit_time"], path, where, "submit_time"), int(gpus), duration, "", f"{path}:{no}"))
    return _finish(path, raw, left, "helios", model)


def pai(path: Path, model: str, job_table: Path | None = None) -> Imported:
    if job_table is None and (path.parent / "pai_job_table.csv").exists():
        job_table = path.parent / "pai_job_table.csv"
    submitted: dict[str, float] = {}
    if job_table is not None:
        for no, row in _rows(job_table, read_text(job_table), PAI_JOB, ("job_name", "start_time")):
            if row["start_time"]:
                submitted[row["job_name"]] = _number(job_table, no, row, "start_time")
    jobs: dict[str, dict] = {}
    left = Counter()
    for no, row in _rows(path, read_text(path), PAI_TASK, ("job_name", "inst_num", "plan_gpu", "start_time")):
        job = jobs.setdefault(row["job_name"], {"gpus": 0, "start": math.inf, "end": -math.inf, "types": set(),
                                                "open": False, "line": no})
        if not row["plan_gpu"]:
            continue  # a CPU task of the job
        if not row["start_time"] or not row["end_time"]:
            job["open"] = True  # running or waiting when the trace was taken
            continue
        inst = _number(path, no, row, "inst_num")
        plan = _number(path, no, row, "plan_gpu")
        job["gpus"] += int(inst) * math.ceil(plan / 100)
        job["start"] = min(job["start"], _number(path, no, row, "start_time"))
        job["end"] = max(job["end"], _number(path, no, row, "end_time"))
        if row.get("gpu_type"):
            job["types"].add(PAI_TYPES.get(row["gpu_type"], row["gpu_type"]))
    raw = []
    for name, job in jobs.items():
        if job["open"]:
            left["running or waiting when the trace ends"] += 1
            continue
        if job["gpus"] < 1:
            left["no GPU"] += 1
            continue
        if job["end"] <= job["start"]:
            left["no run time"] += 1
            continue
        where = f"line {job['line']}"
        duration = check_duration(str(job["end"] - job["start"]),
                                  lambda p, w=where: TraceError(f"{path}: {w}: end_time - start_time: {p}"))
        types = [t for t in job["types"] if t in GPU_MODELS]
        arrival = min(submitted.get(name, job["start"]), job["start"])
        raw.append((arrival, job["gpus"], duration, types[0] if len(types) == 1 else "", f"{path}:{job['line']}"))
    return _finish(path, raw, left, "pai", model)


def load(path: str | Path, fmt: str = "auto", model: str = "resnet50", job_table: str | Path | None = None) -> Imported:
    """Jobs of a trace file in one of FORMATS ('auto': by its name and first line)."""
    from simulator.inputs.workloads import read_trace

    path = Path(path)
    fmt = detect(path) if fmt == "auto" else fmt
    if fmt == LINGJUN:  # a folder of tables, and its own rack (simulator/inputs/lingjun.py)
        from simulator.inputs import lingjun

        return Imported(*lingjun.load(path, model), LINGJUN)
    if fmt == "csv":
        return Imported(read_trace(path), Counter(), "csv")
    if fmt == "philly":
        return philly(path, model)
    if fmt == "helios":
        return helios(path, model)
    if fmt == "pai":
        return pai(path, model, Path(job_table) if job_table else None)
    if fmt == "sacct":
        raw, left = sacct.load(path)
        return _finish(path, raw, left, "sacct", model)
    raise TraceError(f"--trace-format: unknown {fmt!r} (known: auto, {', '.join(FORMATS)})")

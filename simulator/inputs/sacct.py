"""A lab's own Slurm history as a trace: what `sacct --parsable2` prints.

The file is sacct's own output, fields separated by `|` under a header line, e.g. of

    sacct --parsable2 --allusers --starttime 2026-01-01 \\
          --format JobID,User,Submit,Start,End,State,AllocTRES

`JobID`, `Submit`, `Start` and `End` are needed, and the GPUs from `AllocTRES` (`gres/gpu=4`, or
`gres/gpu:m40=2` per type) or else `AllocGRES`/`ReqGRES` (`gpu:m40:2`). Only jobs are read: a
step's line (`123.batch`, `123.0`, `123.extern`) is skipped. Jobs that never started, had not
ended when sacct ran, or had no GPU are left out and counted. A job's GPU type is its gres type
when it names one of the profiles' GPU models (`m40` is M40). Times are sacct's local
`YYYY-MM-DDTHH:MM:SS`; only differences matter.
"""
from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from profiles import GPU_MODELS
from simulator.inputs.workloads import TraceError, check_duration, read_text

NEEDED = ("JobID", "Submit", "Start", "End")
NOT_A_TIME = {"", "Unknown", "None"}
_MODELS = {m.lower(): m for m in GPU_MODELS}
_TRES_GPU = re.compile(r"^gres/gpu(?::(?P<type>[^=]+))?=(?P<n>\S+)$")
_GRES_GPU = re.compile(r"^gpu(?::(?P<type>[^:(]+))?(?::(?P<n>\d+))?(?:\(.*\))?$")


def is_sacct(first_line: str) -> bool:
    """Whether a file's first line is sacct --parsable2's header."""
    names = first_line.strip().split("|")
    return len(names) > 1 and all(n in names for n in NEEDED)


def _time(path: Path, no: int, name: str, text: str) -> float | None:
    if text in NOT_A_TIME:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise TraceError(f"{path}: line {no}: {name}: {text!r} is not a time YYYY-MM-DDTHH:MM:SS") from None


def _count(path: Path, no: int, name: str, text: str) -> int:
    if not text.isdigit():
        raise TraceError(f"{path}: line {no}: {name}: {text!r} is not a whole number of GPUs")
    return int(text)


def gpus_of(path: Path, no: int, row: dict[str, str]) -> tuple[int, str]:
    """(GPUs, gres type or '') of one job's line."""
    if row.get("AllocTRES"):
        total, typed, kinds = None, 0, set()
        for item in row["AllocTRES"].split(","):
            m = _TRES_GPU.match(item.strip())
            if not m:
                continue
            n = _count(path, no, "AllocTRES", m["n"])
            if m["type"]:
                typed += n
                kinds.add(m["type"])
            else:
                total = n
        return (typed if total is None else total), (kinds.pop() if len(kinds) == 1 else "")
    for name in ("AllocGRES", "ReqGRES"):
        if not row.get(name):
            continue
        total, kinds = 0, set()
        for item in row[name].split(","):
            m = _GRES_GPU.match(item.strip())
            if not m:
                continue
            total += _count(path, no, name, m["n"] or "1")
            if m["type"]:
                kinds.add(m["type"])
        return total, (kinds.pop() if len(kinds) == 1 else "")
    return 0, ""


def rows(path: Path, text: str):
    """(line number, field dict) of each job's line (steps skipped)."""
    lines = text.splitlines()
    header_no = next((i for i, line in enumerate(lines) if line.strip()), None)
    if header_no is None:
        raise TraceError(f"{path}: empty")
    names = lines[header_no].strip().split("|")
    missing = [n for n in NEEDED if n not in names]
    if missing:
        raise TraceError(f"{path}: line {header_no + 1}: not sacct --parsable2 output: the header lacks "
                         f"{', '.join(missing)} (sacct --parsable2 --format JobID,Submit,Start,End,State,AllocTRES)")
    if "AllocTRES" not in names and "AllocGRES" not in names and "ReqGRES" not in names:
        raise TraceError(f"{path}: line {header_no + 1}: the header names no AllocTRES (or AllocGRES) field: "
                         "the jobs' GPUs are not in this dump")
    for i in range(header_no + 1, len(lines)):
        line = lines[i].rstrip("\r")
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) == len(names) + 1 and fields[-1] == "":  # --parsable (not 2) ends each line with |
            fields = fields[:-1]
        if len(fields) != len(names):
            raise TraceError(f"{path}: line {i + 1}: {len(fields)} fields, expected {len(names)} ({'|'.join(names)})")
        row = dict(zip(names, (f.strip() for f in fields), strict=True))
        if not row["JobID"] or "." in row["JobID"]:
            if not row["JobID"]:
                raise TraceError(f"{path}: line {i + 1}: JobID: empty")
            continue  # a step of a job
        yield i + 1, row


def load(path: Path) -> list[tuple[float, int, float, str, str]]:
    """(submit time, GPUs, run time, GPU model or '', file:line) per job, and what was left out."""
    raw, left = [], Counter()
    for no, row in rows(path, read_text(path)):
        submit = _time(path, no, "Submit", row["Submit"])
        start = _time(path, no, "Start", row["Start"])
        end = _time(path, no, "End", row["End"])
        gpus, kind = gpus_of(path, no, row)
        if submit is None or start is None:
            left["never started"] += 1
            continue
        if end is None:
            left["not ended when sacct ran"] += 1
            continue
        if gpus < 1:
            left["no GPU"] += 1
            continue
        if end <= start:
            left["no run time"] += 1
            continue
        duration = check_duration(str(end - start), lambda p, n=no: TraceError(f"{path}: line {n}: End - Start: {p}"))
        raw.append((submit, gpus, duration, _MODELS.get(kind.lower(), ""), f"{path}:{no}"))
    return raw, left

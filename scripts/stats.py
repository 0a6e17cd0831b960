"""What every benchmark reports over its repetitions (min, median, max), and how it records them (--json)."""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def percentile(values, p: float) -> float:
    """The p-th percentile, interpolated between the closest ranks (p 50: the median; p 99 of 20 values lies between
    the two largest)."""
    xs = sorted(values)
    at = (len(xs) - 1) * p / 100
    lo = int(at)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (at - lo)


def spread(values, scale: float = 1.0, digits: int = 3) -> dict:
    """min, median and max of `values` times `scale`, with n and the values themselves."""
    xs = [v * scale for v in values]
    if not xs:
        raise ValueError("no repetitions to summarise")
    r = lambda v: round(v, digits)  # noqa: E731
    return {"n": len(xs), "min": r(min(xs)), "median": r(statistics.median(xs)), "max": r(max(xs)),
            "values": [r(v) for v in xs]}


def show(s: dict, unit: str = "", digits: int = 1) -> str:
    """'12.3 (10.1–15.0) ms': the median, then min–max over the repetitions."""
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'])} ({f.format(s['min'])}–{f.format(s['max'])}){' ' + unit if unit else ''}"


_VERSIONS: dict = {}  # the checkout's state when the benchmark started (add_json_option), not when it wrote
_LOAD: dict = {}  # the host's load average (1, 5, 15 min) when it started, and when it wrote


def _versions() -> dict:
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:  # run as a file (python scripts/bench_x.py): scripts/ itself is on sys.path
        sys.path.insert(0, root)
    from evidence.records import versions

    return versions(full=False)


def _load() -> list[float] | None:
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def add_json_option(parser: argparse.ArgumentParser) -> None:
    _VERSIONS.update(_versions())
    _LOAD.update(start=_load())
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write every figure, with min/median/max and the raw repetitions, to PATH")


def write_json(path: Path | None, results) -> None:
    """Write `results` with what produced them: the command, the host, the time, the commit (and whether the
    checkout differed from it), python and the kernel, and the host's load average when it started and ended
    (other work on the host shows in a benchmark's figures)."""
    if path is None:
        return
    record = {"command": [Path(sys.argv[0]).name, *sys.argv[1:]], "host": platform.node(),
              "cpus": _cpus(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": _VERSIONS or _versions(),
              "load_average": {**_LOAD, "end": _load()}, "results": results}
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


def _cpus() -> int | None:
    import os

    return os.cpu_count()

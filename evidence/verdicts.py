"""The trace check's verdict of a model, kept: when the model changes, `make report` computes verdicts for the new
model only (its replays, its simulator), and an earlier model's verdict would leave the docs. Before a model change
lands, `python -m evidence.verdicts --write` keeps the current model's: every judged trace's comparisons (each
replay record of that model beside that model's simulation, evidence/tracecheck.py), as the report computes them,
in results/verdicts/<fingerprint, 12 hex>.json, with the commit it was made at. The report's
sim-trace-verdict-earlier block renders each kept verdict whose model is not the current one, by the bars in force
when each of its replays was made (evidence/tracejudge.py), exactly as sim-trace-verdict rendered it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from evidence.report.bench import RESULTS, ROOT


def make(results: Path = RESULTS, fingerprint: str | None = None) -> dict:
    """The current model's verdict record: each judged trace's comparisons (as the report computes them)."""
    from evidence.report import trace

    traces, current = {}, None
    for path in trace.JUDGED:
        comparisons, _, current = trace.trace_comparisons(results, fingerprint, path)
        traces[path.name] = [[name, by] for name, by in comparisons]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    return {"model_fingerprint": current, "commit": commit.strip() or "unknown",
            "command": "python -m evidence.verdicts --write", "traces": traces}


def write(results: Path = RESULTS, fingerprint: str | None = None) -> Path:
    record = make(results, fingerprint)
    from evidence.report.trace import VERDICTS

    folder = results / VERDICTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record['model_fingerprint'][:12]}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")  # in the order the report shows the traces
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evidence.verdicts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="keep the current model's verdict (before a model "
                        "change lands), in results/verdicts/<fingerprint>.json")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records' folder (results/)")
    args = parser.parse_args(argv)
    if not args.write:
        from evidence.report.trace import load_verdicts

        for kept in load_verdicts(args.results):
            print(f"{kept['path']}: model {kept['model_fingerprint'][:12]}, commit {kept['commit'][:7]}, "
                  f"{sum(len(c) for c in kept['traces'].values())} replay records")
        return 0
    print(f"wrote {write(args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

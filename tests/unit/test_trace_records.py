"""The simulator against the committed trace replays (issue 35): the replay records made with the current model (its
hash, `python -m simulator.modelhash`), at least three, each holding all three policies and the whole trace, meet the
trace check (simulator/tracejudge.py): in each replay median |error| of completion time <= 10 %, p90 <= 20 % and
the same start order; per policy the simulated makespan within 5 % of the replays' mean. A change of the model fails
here until three replays made after its commit are committed, as the demo's fidelity test does for `make demo`
records."""
from __future__ import annotations

import json
from pathlib import Path

from simulator import modelhash, tracecheck, tracejudge
from simulator.workloads import read_trace

ROOT = Path(__file__).resolve().parents[2]
REPLAYS = ROOT / "results" / "replay"
TRACE = ROOT / "traces" / "trace16.csv"


def test_the_replays_of_the_current_model_meet_the_trace_check():
    current = modelhash.model_hash()
    trace = [{"arrival_s": j.arrival_s, "gpus": j.gpus, "model": j.model, "iterations": j.iterations}
             for j in sorted(read_trace(TRACE), key=lambda j: j.arrival_s)]
    comparisons = []
    for path in sorted(REPLAYS.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("model_hash") != current:
            continue
        assert record["jobs_replayed"] == len(trace), f"{path.name}: not the whole trace"
        comparisons.append((path.stem, tracecheck.compare_record(record, trace, ROOT / record["rack_file"])))
    bad = tracejudge.verdict(comparisons)
    assert not bad, (f"the trace check fails on the replays of the current model {current[:12]} (make and commit "
                     "three with scripts/replay_trace.py after the model's commit):\n" + "\n".join(bad))

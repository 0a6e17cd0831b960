"""The simulator against the committed trace replays (issue 35): the replay records made with the current model (its
hash, `python -m evidence.modelhash`), at least three, each holding all three policies and the whole trace, meet the
trace check (evidence/tracejudge.py): in each replay median |error| of completion time <= 10 %, p90 <= 20 % and
the same start order; per policy the simulated makespan within 5 % of the replays' mean. A change of the model fails
here until three replays made after its commit are committed, as the demo's fidelity test does for `make demo`
records."""
from __future__ import annotations

from evidence import tracejudge
from evidence.report.trace import TRACE, trace_comparisons
from simulator.inputs.workloads import read_trace


def test_the_replays_of_the_current_model_meet_the_trace_check():
    comparisons, _, current = trace_comparisons()
    whole = len(read_trace(TRACE))
    partial = [f"{name} {policy}" for name, by in comparisons for policy, c in by.items() if len(c["jobs"]) != whole]
    assert not partial, f"replays that are not the whole trace: {partial}"
    bad = tracejudge.verdict(comparisons)
    assert not bad, (f"the trace check fails on the replays of the current model {current[:12]} (make and commit "
                     "three with scripts/replay_trace.py after the model's commit):\n" + "\n".join(bad))

"""The simulator against the committed trace replays: for each judged trace, every replay record of the current model
(its fingerprint) is the whole trace with all three policies, and is judged by bars set before it
(evidence/bars/, evidence/tracebars.py). Whether the bars are met is the verdict make report renders in
docs/simulator.md (block sim-trace-verdict, kept current by the report's own check); a miss stays in it until
later, pre-set bars are met by replays made after them."""
from __future__ import annotations

import pytest

from evidence import tracejudge
from evidence.report.trace import JUDGED, trace_comparisons
from simulator.inputs.workloads import read_trace


@pytest.mark.parametrize("trace", JUDGED, ids=lambda p: p.name)
def test_the_replays_of_the_current_model_are_whole_and_judged_by_bars_set_before_them(trace):
    comparisons, _, current = trace_comparisons(trace=trace)
    whole = len(read_trace(trace))
    partial = [f"{name} {policy}" for name, by in comparisons for policy, c in by.items() if len(c["jobs"]) != whole]
    assert not partial, f"replays that are not the whole trace: {partial}"
    groups, unjudged = tracejudge.judge(comparisons, current)
    assert not unjudged, (f"replays of the model {current[:12]} made before any bars of it were set (commit "
                          f"evidence/bars/trace-v<N>.toml before the replays): {unjudged}")
    missing = [x for g in groups for x in g["missing"]]
    assert not missing, f"replays without all three policies: {missing}"

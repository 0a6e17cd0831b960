"""evidence/tracejudge.py: the trace check's verdict over several replays, on synthetic comparisons: per-job bounds
and the start order in each replay, the makespan against the replays' mean, three records at least."""
from __future__ import annotations

import pytest

from evidence import tracejudge


def _c(makespan_emulated: float, makespan_simulated: float = 100.0, median: float = 0.05, p90: float = 0.15,
       same: bool = True) -> dict:
    """One policy run's comparison, as tracecheck.compare gives it (the fields the verdict reads)."""
    return {"jct_error_median": median, "jct_error_p90": p90, "start_order_same": same,
            "start_order_discordant": [] if same else [(1, 2)], "makespan_emulated_s": makespan_emulated,
            "makespan_simulated_s": makespan_simulated, "makespan_error": makespan_simulated / makespan_emulated - 1}


def _records(*makespans: float, **kw) -> list:
    return [(f"r{i}", {p: _c(m, **kw) for p in tracejudge.POLICIES}) for i, m in enumerate(makespans)]


def test_a_replay_more_than_5_percent_off_passes_when_the_mean_is_within():
    recs = _records(94.0, 100.0, 106.0)  # the first and last replays 6 % either side, their mean 100
    by = tracejudge.by_policy(recs)["defrag"]
    assert by["makespan_emulated_mean_s"] == pytest.approx(100.0)
    assert by["per_record_makespan"][0] == pytest.approx(100 / 94 - 1)  # each record's own error still shown
    assert by["makespan_emulated_spread"] == pytest.approx(106 / 94 - 1)
    assert tracejudge.verdict(recs) == []


def test_a_mean_more_than_5_percent_off_fails_naming_the_policy():
    recs = _records(110.0, 112.0, 108.0)  # mean 110: the simulated 100 is -9.1 %
    bad = tracejudge.verdict(recs)
    assert len(bad) == 3 and all("from the replays' mean 110.0 s" in b for b in bad)
    assert any(b.startswith("fixed: simulated makespan 100.0 s is -9.1 %") for b in bad)


@pytest.mark.parametrize("kw, what", [({"median": 0.11}, "median |error| of completion time 11.0 % > 10 %"),
                                      ({"p90": 0.21}, "p90 |error| of completion time 21.0 % > 20 %"),
                                      ({"same": False}, "start order differs: 1 pairs")])
def test_each_replay_must_keep_the_per_job_bounds_and_the_start_order(kw, what):
    recs = _records(100.0, 100.0, 100.0)
    recs[1] = ("r1", {p: _c(100.0, **kw) for p in tracejudge.POLICIES})
    bad = tracejudge.verdict(recs)
    assert len(bad) == 3 and all(b.startswith("r1 ") and what in b for b in bad)
    assert "| NO: r1 fixed: " in tracejudge.table(recs)


def test_fewer_than_three_records_or_a_missing_policy_fail():
    assert tracejudge.verdict(_records(100.0, 100.0)) == [
        "2 replay record(s) of the current model; the check needs 3"]
    recs = _records(100.0, 100.0, 100.0)
    del recs[2][1]["regroup"]
    assert tracejudge.verdict(recs) == ["r2: no regroup run"]

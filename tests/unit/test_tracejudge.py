"""evidence/tracejudge.py: the trace check's verdict over several replays of one trace, on synthetic comparisons,
by the bars in force when each replay was made: the literal bars per replay, the noise-aware ones against the
replays' mean where the bars set them, and records made before any bars of their model judged by none."""
from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from evidence import tracebars, tracejudge

MODEL = "ab" * 32
LITERAL = {"jct_error_median": 0.10, "jct_error_p90": 0.20, "makespan_error": 0.05, "start_order": "same"}


def _bars(version: int, day: int, noise: bool) -> tracebars.Bars:
    return tracebars.Bars(version, datetime(2026, 11, day, tzinfo=UTC), MODEL, LITERAL,
                          {**LITERAL, "min_replays": 3} if noise else None, Path(f"trace-v{version}.toml"))


V1, V2 = _bars(1, 20, False), _bars(2, 25, True)


def _c(makespan_emulated: float, jct: float = 100.0, simulated: float = 100.0, order=(0, 1, 2)) -> dict:
    """One policy run's comparison, as tracecheck.compare gives it: three jobs of completion time `jct` emulated,
    `simulated` simulated; the makespans and the emulated start order as given (the simulator's is 0, 1, 2)."""
    jobs = [{"index": i, "jct_emulated_s": jct, "jct_simulated_s": simulated} for i in range(3)]
    errors = [abs(simulated / jct - 1)] * 3
    return {"jobs": jobs, "jct_error_median": errors[0], "jct_error_p90": errors[0],
            "start_order_emulated": list(order), "start_order_simulated": [0, 1, 2],
            "start_order_same": list(order) == [0, 1, 2],
            "start_order_discordant": [] if list(order) == [0, 1, 2] else [(1, 2)],
            "makespan_emulated_s": makespan_emulated, "makespan_simulated_s": 100.0,
            "makespan_error": 100.0 / makespan_emulated - 1}


def _records(day: int, *makespans: float, **kw) -> list:
    return [(f"202611{day:02d}T00000{i}Z-abc1234", {p: _c(m, **kw) for p in tracejudge.POLICIES})
            for i, m in enumerate(makespans)]


def test_a_literal_miss_stays_a_miss_when_the_mean_is_within():
    recs = _records(26, 94.0, 100.0, 106.0)  # the first and last 6 % either side, their mean 100
    groups, unjudged = tracejudge.judge(recs, MODEL, [V1, V2])
    assert unjudged == [] and [g["bars"].version for g in groups] == [2]
    m, noise = groups[0]["by_policy"]["defrag"]
    assert m["makespan_emulated_mean_s"] == pytest.approx(100.0) and noise == []  # within, against the mean
    assert m["makespan_spread"] == pytest.approx(106 / 94 - 1)
    bad = tracejudge.verdict(recs, MODEL, [V1, V2])
    assert len(bad) == 6 and all(b.startswith("literal v2 ") and "makespan" in b for b in bad)  # 2 records x 3


def test_replays_made_before_a_version_are_judged_by_the_one_before_it():
    recs = _records(22, 94.0, 100.0, 106.0)  # made after v1, before v2: v1 judges them, and it has no noise bar
    groups, _ = tracejudge.judge(recs, MODEL, [V1, V2])
    assert [g["bars"].version for g in groups] == [1]
    lit, noise = tracejudge.misses(groups[0])
    assert noise is None and len(lit) == 6
    assert "none set before these replays" in tracejudge.table(groups[0])
    early = _records(19, 100.0)  # before any bars of the model; and of another model
    assert tracejudge.judge(early, MODEL, [V1, V2])[1] == [early[0][0]]
    assert tracejudge.judge(recs, "cd" * 32, [V1, V2])[1] == [name for name, _ in recs]
    assert tracejudge.verdict(early, MODEL, [V1, V2]) == [f"{early[0][0]}: no bars of its model were set before it"]


def test_a_mean_more_than_5_percent_off_fails_the_noise_aware_bar_naming_the_policy():
    recs = _records(26, 110.0, 112.0, 108.0)  # mean 110: the simulated 100 is -9.1 %
    bad = [b for b in tracejudge.verdict(recs, MODEL, [V1, V2]) if b.startswith("noise-aware")]
    assert len(bad) == 3 and any("fixed: makespan -9.1 % from the replays' mean" in b for b in bad)


def test_per_job_errors_against_the_mean_and_the_replays_own_noise():
    recs = [(f"20261126T00000{i}Z-abc1234", {"fixed": _c(100.0, jct=j)}) for i, j in enumerate((80.0, 100.0, 120.0))]
    (g,), _ = tracejudge.judge(recs, MODEL, [V1, V2])
    m, noise = g["by_policy"]["fixed"]
    assert m["jct_error_median"] == pytest.approx(0.0)  # the simulated 100 s is the jobs' mean
    assert m["jct_noise_median"] == pytest.approx(0.5)  # 120 against 80, the farthest pair of replays
    assert noise == [] and tracejudge.misses(g)[1] == ["20261126T000000Z-abc1234: no regroup, defrag run",
                                                       "20261126T000001Z-abc1234: no regroup, defrag run",
                                                       "20261126T000002Z-abc1234: no regroup, defrag run"]
    slow = [(f"20261126T00000{i}Z-abc1234", {"fixed": _c(100.0, simulated=115.0)}) for i in range(3)]
    (g,), _ = tracejudge.judge(slow, MODEL, [V1, V2])
    assert any("median |error| against the jobs' mean 15.0 % > 10 %" in x for x in g["by_policy"]["fixed"][1])


def test_the_start_order_may_differ_by_no_more_than_the_replays_differ_from_each_other():
    same = [(f"20261126T00000{i}Z-abc1234", {"fixed": _c(100.0, order=o)})
            for i, o in enumerate(((0, 1, 2), (0, 2, 1), (0, 1, 2)))]
    (g,), _ = tracejudge.judge(same, MODEL, [V1, V2])
    assert g["by_policy"]["fixed"][1] == []  # one pair against a replay, the replays one pair apart
    assert g["literal"][("20261126T000001Z-abc1234", "fixed")] == [
        "start order differs: 1 pairs of jobs the other way round"]  # literally, a miss
    alike = [(f"20261126T00000{i}Z-abc1234", {"fixed": _c(100.0, order=(0, 2, 1))}) for i in range(3)]
    (g,), _ = tracejudge.judge(alike, MODEL, [V1, V2])
    assert g["by_policy"]["fixed"][1] == [
        "start order: 1 pairs the other way round against a replay, the replays 0 against each other"]


def test_fewer_replays_than_the_noise_aware_bar_needs_fail_it():
    recs = _records(26, 100.0, 100.0)
    bad = tracejudge.verdict(recs, MODEL, [V1, V2])
    assert bad and all("2 replay(s); the noise-aware bar needs 3" in b for b in bad)


def test_replays_queued_otherwise_are_judged_apart_never_averaged_with_fifos():
    """A replay under backfill is another run of the trace: its own group (its noise-aware bar then lacks replays),
    the fifo replays' mean untouched by it."""
    fifo = _records(26, 100.0, 100.0, 100.0)
    backfill = [("20261126T000009Z-abc1234", {p: {**_c(150.0), "scheduler": "backfill"} for p in tracejudge.POLICIES})]
    groups, _ = tracejudge.judge(fifo + backfill, MODEL, [V1, V2])
    assert [(g["bars"].version, g["scheduler"], len(g["records"])) for g in groups] == [(2, "fifo", 3),
                                                                                        (2, "backfill", 1)]
    m, noise = groups[0]["by_policy"]["fixed"]
    assert m["makespan_emulated_mean_s"] == pytest.approx(100.0) and noise == []
    _, noise = groups[1]["by_policy"]["fixed"]
    assert any("needs 3" in x for x in noise)
    assert "queueing by backfill" in tracejudge.table(groups[1])
    assert all("(backfill)" in line for line in tracejudge.verdict(fifo + backfill, MODEL, [V1, V2]))

"""scripts/bench_reconfig.py without a rack: how a recorded event's switch programming splits at the dark window."""
from __future__ import annotations

import pytest

from scripts.bench_reconfig import _programming


@pytest.mark.parametrize("start, end, expected", [
    (10.002, 10.020, (0.018, 0.018, 0.0)),  # all of it hidden by the 25 ms window
    (10.002, 10.040, (0.038, 0.023, 0.015)),  # it outlasts the window by 15 ms
    (10.030, 10.035, (0.005, 0.0, 0.005)),  # started after the window (not the controller's order, but counted)
])
def test_switch_programming_splits_at_the_dark_window(start, end, expected):
    ev = {"dark_start": 10.0, "dark_end": 10.025, "fabric_started_at": start, "fabric_confirmed_at": end}
    assert _programming(ev) == pytest.approx(expected)


def test_an_event_without_programming_times_counts_none():
    assert _programming({"dark_start": 1.0, "dark_end": 1.025}) == (0.0, 0.0, 0.0)

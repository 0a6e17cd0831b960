"""evidence/skew.py: how long a ring's ranks spend computing and communicating at once, from a run's summary."""
from __future__ import annotations

import pytest

from evidence import skew


def test_overlap_is_zero_where_ranks_enter_together_and_the_shared_time_otherwise():
    together = {"mean_compute_rack_s": 0.2, "mean_comm_rack_s": 0.8, "mean_iteration_rack_s": 1.0}
    assert skew.overlap(together) == pytest.approx(0.0)
    early = {"mean_compute_rack_s": 0.2, "mean_comm_rack_s": 0.87, "mean_iteration_rack_s": 0.97}
    assert skew.overlap(early) == pytest.approx(0.1)


def test_the_table_gives_each_runs_error_and_overlaps():
    row = {"record": "r", "run": "fragmented #1", "concern_s": 1.0, "concern_sim_s": 0.94, "concern_overlap_s": 0.001,
           "beside_s": 0.97, "beside_sim_s": 1.14, "beside_overlap_s": 0.105}
    text = skew.table([row])
    assert "1.000 → 0.940 s (-6.0 %)" in text and "0.105 s" in text

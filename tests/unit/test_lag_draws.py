"""The trace check's ensemble (simulator/model/lags.py's draws, tracesim.simulate): each job's start lags drawn from
the emulation's spread around them, the prediction the mean over the draws."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from controller.core.rack import load_rack
from simulator.model import calibration, lags, tracesim

ROOT = Path(__file__).resolve().parents[2]
RACK = ROOT / "topologies" / "trace16.yaml"
TRACE = [{"arrival_s": 0.0, "gpus": 4, "model": "resnet50", "iterations": 20},
         {"arrival_s": 0.5, "gpus": 2, "model": "vgg16", "iterations": 10},
         {"arrival_s": 1.0, "gpus": 8, "model": "resnet50", "iterations": 15},
         {"arrival_s": 1.5, "gpus": 6, "model": "vgg16", "iterations": 10}]


def test_the_draws_are_the_same_each_time_and_follow_the_measured_spread():
    a, b = lags.draws(3, 5), lags.draws(3, 5)
    assert a == b and len(a) == 5 and all(len(d) == 3 for d in a)
    assert lags.draws(3, 6)[:5] == a  # draw i is seed i's whatever the count
    assert len({d for d in a}) == 5
    big = lags.draws(20000, 1)[0]
    log_c = [math.log(c) for c, _ in big]
    log_s = [math.log(s) for _, s in big]
    assert statistics.fmean(c for c, _ in big) == pytest.approx(1.0, abs=0.02)  # mean one: the lags as fitted
    assert statistics.fmean(s for _, s in big) == pytest.approx(1.0, abs=0.02)
    assert statistics.pstdev(log_c) == pytest.approx(lags.CONTAINERS_LOG_SD, abs=0.01)
    assert statistics.pstdev(log_s) == pytest.approx(lags.START_LOG_SD, abs=0.01)
    assert statistics.correlation(log_c, log_s) == pytest.approx(lags.LOG_CORRELATION, abs=0.03)


def _rack():
    if not RACK.exists():
        pytest.fail(f"{RACK} is missing")
    return load_rack(RACK)


def test_a_jitter_multiplies_each_job_s_two_start_lags_and_none_is_the_lags_as_fitted():
    cal = calibration.from_record({"fabric": "lossless"})
    _, plain = tracesim._run(_rack(), TRACE, "fixed", 300.0, cal, True, False, "fifo")
    _, none = tracesim._run(_rack(), TRACE, "fixed", 300.0, cal, True, False, "fifo", 1.0, None)
    jitter = ((2.0, 3.0),) + ((1.0, 1.0),) * (len(TRACE) - 1)
    _, twice = tracesim._run(_rack(), TRACE, "fixed", 300.0, cal, True, False, "fifo", 1.0, jitter)
    p, n, t = plain.run().jobs[0], none.run().jobs[0], twice.run().jobs[0]
    assert (p.placed_s, p.started_s, p.start_s, p.end_s) == (n.placed_s, n.started_s, n.start_s, n.end_s)
    assert t.placed_s == p.placed_s
    assert t.started_s - t.placed_s == pytest.approx(2.0 * (p.started_s - p.placed_s))
    # the first iteration: containers' start plus the start lag, both multiplied (nothing else holds it back)
    assert t.start_s - t.started_s == pytest.approx(3.0 * (p.start_s - p.started_s), rel=1e-6)


def test_the_prediction_is_each_row_s_mean_over_the_draws(monkeypatch):
    cal = calibration.from_record({"fabric": "lossless"})
    monkeypatch.setattr(lags, "DRAWS", 3)
    rows, changes = tracesim.simulate(RACK, TRACE, "regroup", 300.0, cal)
    each = [tracesim._once(_rack(), TRACE, "regroup", 300.0, cal, True, False, "fifo", 1.0, j)
            for j in lags.draws(len(TRACE), 3)]
    for i, row in enumerate(rows):
        for k in ("admit_s", "start_s", "end_s"):
            assert row[k] == pytest.approx(statistics.fmean(rs[i][k] for rs, _ in each), rel=1e-12)
    assert changes == round(statistics.fmean(c for _, c in each))
    assert len({rs[2]["end_s"] for rs, _ in each}) > 1  # the draws differ: a mean of one run would not test it
    one, _ = tracesim.simulate(RACK, TRACE, "regroup", 300.0, cal, ensemble=False)
    assert one == tracesim._once(_rack(), TRACE, "regroup", 300.0, cal, True, False, "fifo", 1.0, None)[0]

"""The trace check's trace generator and its committed trace (traces/trace16.csv), and the rack it is for."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.core.rack import load_rack
from scripts import trace_gen

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_trace_is_the_generators_output_for_its_seed():
    jobs = trace_gen.generate(35, 40)
    assert (ROOT / "traces" / "trace16.csv").read_text() == trace_gen.csv_text(jobs, 35, trace_gen.LOAD)
    assert trace_gen.generate(36, 40) != jobs  # the seed decides


def test_jobs_of_1_to_8_gpus_arrive_in_order_faster_than_the_rack_runs_them():
    jobs = trace_gen.generate(35, 40)
    assert 30 <= len(jobs) <= 50 and {j["gpus"] for j in jobs} <= set(range(1, 9))
    assert [j["arrival_s"] for j in jobs] == sorted(j["arrival_s"] for j in jobs)
    work = sum(j["gpus"] * j["iterations"] * trace_gen.EST_ITERATION_S for j in jobs)
    span = jobs[-1]["arrival_s"]
    assert work / (16 * span) > 1.0  # offered load above the rack's: a queue forms


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="--jobs"):
        trace_gen.generate(1, 0)
    assert trace_gen.main(["--jobs", "0"]) == 2


def test_the_trace_rack_has_16_gpus_of_two_models_two_ocs_and_oversubscribed_uplinks():
    rack = load_rack(ROOT / "topologies" / "trace16.yaml")
    assert len(rack.gpus) == 16 and len({g.model for g in rack.gpus.values()}) == 2
    assert len(rack.ocs) == 2
    aggs = [w for w in rack.spec.switches if w.downlinks]
    assert len(aggs) == 4
    for w in aggs:
        down = sum(d.rate_gbps for d in w.downlinks)
        assert len(w.downlinks) > 4  # spare downlinks beyond the 4 GPUs a switch holds at the start
        assert down > 4 * sum(u.rate_gbps for u in w.uplinks)  # oversubscribed

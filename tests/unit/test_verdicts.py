"""evidence/verdicts.py: a model's trace-check verdict kept in a record, so that a changed model does not take it off
the page: written from the comparisons the report computes, read back, and rendered by the sim-trace-verdict-earlier
block exactly as sim-trace-verdict rendered it while that model was current (synthetic comparisons; the bars are the
committed ones, which never change)."""
from __future__ import annotations

import json

import pytest

from evidence import verdicts
from evidence.report import trace

FP = "abec90b9f627c7fdf52670c18ae4cf081a15a84f0a07c825ea31af6b2a6d71ea"  # the model bars v1 and v2 judge
OTHER = "0" * 64


def _c(makespan: float, jct: float, order=(0, 1, 2)) -> dict:
    jobs = [{"index": i, "jct_emulated_s": jct, "jct_simulated_s": 100.0} for i in range(3)]
    error = abs(100.0 / jct - 1)
    return {"jobs": jobs, "jct_error_median": error, "jct_error_p90": error, "start_order_emulated": list(order),
            "start_order_simulated": [0, 1, 2], "start_order_same": list(order) == [0, 1, 2],
            "start_order_discordant": [] if list(order) == [0, 1, 2] else [(1, 2)],
            "makespan_emulated_s": makespan, "makespan_simulated_s": 100.0, "makespan_error": 100.0 / makespan - 1,
            "scheduler": "fifo"}


@pytest.fixture
def comparisons(monkeypatch):
    """Three replays after bars v2 of each judged trace, the last with a per-job miss and a start-order miss."""
    def fake(results, fingerprint=None, path=trace.TRACE):
        recs = [(f"20261129T0{i}0000Z-abc1234", {p: _c(100.0 + i, 100.0 if i < 2 else 130.0,
                                                       (0, 1, 2) if i < 2 else (0, 2, 1))
                                                  for p in ("fixed", "regroup", "defrag")}) for i in range(3)]
        return recs, [], fingerprint or FP
    monkeypatch.setattr(trace, "trace_comparisons", fake)


def test_a_kept_verdict_renders_as_it_did_while_its_model_was_current(tmp_path, comparisons):
    (tmp_path / "replay").mkdir()
    (tmp_path / "replay" / "20261129T000000Z-abc1234.json").write_text("{}")  # read by the fake comparisons only
    live = trace.sim_trace_verdict([], results=tmp_path, fingerprint=FP)
    assert "missed:" in live and "start order" in live
    assert trace.sim_trace_verdict_earlier([], results=tmp_path, fingerprint=FP).startswith("None yet")
    path = verdicts.write(tmp_path, FP)
    assert path == tmp_path / "verdicts" / f"{FP[:12]}.json"
    assert json.loads(path.read_text())["model_fingerprint"] == FP
    # still the current model: nothing earlier to show
    assert trace.sim_trace_verdict_earlier([], results=tmp_path, fingerprint=FP).startswith("None yet")
    earlier = trace.sim_trace_verdict_earlier([], results=tmp_path, fingerprint=OTHER)
    heading, body = earlier.split("\n\n", 1)
    assert heading.startswith(f"### The model {FP[:12]}")
    assert body == live  # every table and every miss, as it was


def test_a_verdict_record_that_lacks_what_it_needs_is_named(tmp_path):
    (tmp_path / "verdicts").mkdir()
    (tmp_path / "verdicts" / "x.json").write_text('{"traces": {}}')
    with pytest.raises(trace.ReportError, match="x.json: not a verdict record"):
        trace.load_verdicts(tmp_path)

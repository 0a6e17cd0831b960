"""evidence/report/trace.py: the trace check's blocks of make report, from synthetic replay records (so a changed
figure changes the table); a record that is not one is an error naming the file."""
from __future__ import annotations

import json
import re

import pytest

from evidence.report import engine as report
from evidence.report import trace as report_trace
from evidence.report.bench import ReportError


def _write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_block_is_one_of_make_reports():
    assert all(report.BLOCKS[n] is f for n, f in report_trace.BLOCKS.items())


@pytest.mark.parametrize("name", sorted(report_trace.BLOCKS))
def test_a_missing_record_is_an_error_naming_it(tmp_path, name):
    with pytest.raises(ReportError, match=re.escape(str(tmp_path)) + r"/.*: cannot read the record"):
        report_trace.BLOCKS[name]([], tmp_path)


def _replay(fingerprint: str, ends: list[float]) -> dict:
    """A replay record (scripts/replay_trace.py) of the trace's first len(ends) jobs under fixed."""
    from scripts.trace_gen import generate

    trace = generate(35, 40)
    jobs = [{"index": i, "submit_s": trace[i]["arrival_s"], "start_s": trace[i]["arrival_s"], "end_s": e,
             "state": "done"} for i, e in enumerate(ends)]
    return {"model_fingerprint": fingerprint, "rack_file": "topologies/trace16.yaml", "jobs_replayed": len(ends),
            "policies": {"fixed": {"jobs": jobs, "summary": {"circuit_changes": 0}, "defrag_interval_s": None}}}


def test_trace_replay_compares_each_record_of_the_current_model_and_names_the_others(tmp_path):
    _write(tmp_path / "replay" / "20261127T000000Z-abc1234.json", json.dumps(_replay("m1", [1000.0, 1000.0])))
    _write(tmp_path / "replay" / "20261126T000000Z-abc1233.json", json.dumps(_replay("m0", [1.0, 1.0])))
    text = report_trace.sim_trace_replay([], tmp_path, fingerprint="m1")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == 1 and rows[0].startswith("| `20261127T000000Z-abc1234` | fixed |")
    assert "NO: median |error|" in rows[0]  # jobs of 1000 s emulated: the simulator is far off, and says so
    assert "not compared (made with another model): 20261126T000000Z-abc1233" in text
    none = report_trace.sim_trace_replay([], tmp_path, fingerprint="m2")  # a model just changed: nothing checks it
    assert none.startswith("No trace replay record was made with the current model (fingerprint m2) yet")
    assert "20261127T000000Z-abc1234" in none and "|" not in none


def test_a_replay_of_a_trace_that_neither_fits_nor_judges_is_shown_in_its_own_block_and_judged_nowhere(tmp_path):
    from simulator.inputs.workloads import read_trace

    interim = sorted(read_trace(report_trace.ROOT / "traces" / "trace16-interim.csv"), key=lambda j: j.arrival_s)
    record = _replay("m1", [])
    record["trace_file"] = "traces/trace16-interim.csv"
    record["jobs_replayed"] = 2
    record["policies"]["fixed"]["jobs"] = [{"index": i, "submit_s": interim[i].arrival_s, "state": "done",
                                            "start_s": interim[i].arrival_s, "end_s": 1000.0} for i in range(2)]
    _write(tmp_path / "replay" / "20261206T160000Z-abc1234.json", json.dumps(record))
    _write(tmp_path / "replay" / "20261206T150000Z-abc1233.json", json.dumps(_replay("m1", [1000.0, 1000.0])))
    text = report_trace.sim_trace_unjudged([], tmp_path, fingerprint="m1")
    assert text.startswith("**`traces/trace16-interim.csv`**")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == 1 and rows[0].startswith("| `20261206T160000Z-abc1234` | fixed |")  # not trace16.csv's
    assert "20261206T160000Z-abc1234" not in report_trace.sim_trace_verdict([], tmp_path, fingerprint="m1")
    none = report_trace.sim_trace_unjudged([], tmp_path, fingerprint="m2")
    assert "No replay by the current model (m2) yet." in none and "|" not in none


def test_the_emulation_against_itself_is_each_pair_of_replays_of_a_trace(tmp_path):
    import shutil

    from evidence import tracefit
    from simulator.inputs.workloads import read_trace

    interim = sorted(read_trace(report_trace.ROOT / "traces" / "trace16-interim.csv"), key=lambda j: j.arrival_s)
    for path in (*tracefit.REPLAYS, *tracefit.DEMO):  # the fit set's records, as committed
        target = tmp_path / path.relative_to(report_trace.RESULTS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    for name, ends in (("20261206T160000Z-abc1234", [10.0, 20.0]), ("20261206T170000Z-abc1234", [11.0, 20.0])):
        record = _replay("m1", [])
        record["trace_file"], record["jobs_replayed"] = "traces/trace16-interim.csv", 2
        record["policies"]["fixed"]["jobs"] = [{"index": i, "submit_s": interim[i].arrival_s, "state": "done",
                                                "start_s": interim[i].arrival_s, "end_s": interim[i].arrival_s + e}
                                               for i, e in enumerate(ends)]
        _write(tmp_path / "replay" / f"{name}.json", json.dumps(record))
    rows = report_trace.sim_trace_noise([], tmp_path, fingerprint="m1").splitlines()
    assert [r.split(" | ")[0] for r in rows[2:]] == ["| `trace16-small.csv` (fit)", "| `trace16.csv` (fit)",
                                                     "| `trace16-interim.csv` (fits nothing)"]
    # job 0 took 10 then 11 s (10 %), job 1 20 s both times: median 5 %, p90 9 % (interpolated); the makespan the same
    assert rows[-1].endswith("| 5.0–5.0 % | 9.0–9.0 % | +0.0 to +0.0 % |"), rows[-1]


def test_trace_replay_of_a_record_that_is_not_one_is_an_error_naming_it(tmp_path):
    path = _write(tmp_path / "replay" / "20261127T000000Z-abc1234.json", json.dumps({"model_fingerprint": "m1"}))
    with pytest.raises(ReportError, match=re.escape(str(path)) + ": not a trace replay record"):
        report_trace.sim_trace_replay([], tmp_path, fingerprint="m1")


def test_trace_verdict_shows_the_literal_and_the_noise_aware_result_by_the_bars_in_force(tmp_path):
    from evidence import tracebars

    model = tracebars.newest().model_fingerprint
    _write(tmp_path / "replay" / "20991231T000000Z-abc1234.json", json.dumps(_replay(model, [1000.0, 1000.0])))
    _write(tmp_path / "replay" / "20200101T000000Z-abc1234.json", json.dumps(_replay(model, [1000.0, 1000.0])))
    text = report_trace.sim_trace_verdict([], tmp_path, fingerprint=model)
    rows = [line for line in text.splitlines() if line.startswith("| fixed |")]
    assert len(rows) == 1 and "| 0 of 1 pass; `20991231T000000Z-abc1234`: median |error|" in rows[0]
    assert f"Bars {tracebars.newest().name}" in text
    assert "Literal bars (1 replays): missed: 20991231T000000Z-abc1234 fixed: median |error|" in text
    assert "Noise-aware bars: missed: fixed: 1 replay(s); the noise-aware bar needs 3" in text
    assert "Judged by no bars (made before any bars of the model were set): 20200101T000000Z-abc1234." in text
    none = report_trace.sim_trace_verdict([], tmp_path, fingerprint="m2")
    assert "No replay by the current model (m2) yet: its replays are pending." in none

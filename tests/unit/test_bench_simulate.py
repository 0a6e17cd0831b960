"""scripts/bench_simulate.py: runs split over several invocations (`--add`) are compared with the record's first by
their results' hash, and a record made with other settings is refused, unchanged."""

from __future__ import annotations

import json

import pytest

from scripts import bench_simulate as bench

SMALL = ["--gpus", "64", "--jobs", "20", "--runs", "1"]


def test_runs_added_to_a_record_are_compared_with_its_first(tmp_path):
    record = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--json", str(record), "--", "--no-plots"]) == 0
    assert bench.main([*SMALL, "--add", "--json", str(record), "--", "--no-plots"]) == 0
    row = json.loads(record.read_text())
    assert len(row["runs"]) == 2 and row["same_results"] is True
    assert row["runs"][0]["figures_sha256"] == row["runs"][1]["figures_sha256"]
    assert row["wall_s"]["min"] == min(r["wall_s"] for r in row["runs"])

    row["runs"][0]["figures_sha256"] = "0" * 64  # a first run whose results were other ones
    record.write_text(json.dumps(row))
    assert bench.main([*SMALL, "--add", "--json", str(record), "--", "--no-plots"]) == 1
    row = json.loads(record.read_text())
    assert len(row["runs"]) == 3 and row["same_results"] is False


def test_adding_to_a_record_of_other_settings_is_refused_and_changes_nothing(tmp_path, capsys):
    record = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--json", str(record), "--", "--no-plots"]) == 0
    before = record.read_text()
    with pytest.raises(SystemExit) as e:
        bench.main([*SMALL, "--seed", "2", "--add", "--json", str(record), "--", "--no-plots"])
    assert e.value.code == 2 and "--seed 2" in capsys.readouterr().err and record.read_text() == before
    with pytest.raises(SystemExit) as e:
        bench.main([*SMALL, "--add", "--json", str(tmp_path / "none.json")])
    assert e.value.code == 2 and not (tmp_path / "none.json").exists()

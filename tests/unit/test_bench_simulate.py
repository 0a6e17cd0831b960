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


def test_the_commit_before_is_run_just_before_each_run_of_this_tree_and_compared(tmp_path):
    record = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--before", "HEAD", "--json", str(record), "--", "--no-plots"]) == 0
    row = json.loads(record.read_text())
    head = bench.subprocess.run(["git", "-C", str(bench.ROOT), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    before = row["before"]
    assert before["commit"] == head and row["commit"].startswith(head)
    assert len(before["runs"]) == len(row["runs"]) == 1 and row["same_results_as_before"] is True
    assert before["runs"][0]["started"] <= row["runs"][0]["started"]
    assert row["speedup"] == before["wall_s"]["median"] / row["wall_s"]["median"]


def test_a_commit_before_with_other_figures_fails_the_benchmark(tmp_path, monkeypatch):
    def fake(args, out, tree=bench.ROOT):
        out.mkdir(parents=True)
        (out / "results.json").write_text("{}")
        old = tree != bench.ROOT
        return {"wall_s": 30.0 if old else 10.0, "peak_rss_bytes": 1, "peak_pss_bytes": 1, "out_bytes": 2,
                "started": "", "load_1min_before": 0.0, "figures_sha256": "a" if old else "b"}

    monkeypatch.setattr(bench, "run", fake)
    record = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--before", "HEAD", "--json", str(record), "--", "--no-plots"]) == 1
    row = json.loads(record.read_text())
    assert row["same_results_as_before"] is False and row["speedup"] == 3.0


def test_a_before_that_is_no_commit_is_refused_naming_it(tmp_path):
    with pytest.raises(SystemExit, match="--before no-such-rev: not a commit"):
        bench.main([*SMALL, "--before", "no-such-rev", "--json", str(tmp_path / "b.json")])
    assert not (tmp_path / "b.json").exists()

"""optirack sweep: a small grid (2 policies x 2 schedulers x 3 loads x 3 seeds, tiny racks) on a local Dask cluster,
and its study table with 95 % intervals."""

from __future__ import annotations

import csv
import json

import distributed  # noqa: F401 (a dependency of the simulator, setup.cfg: missing, this file fails, never skips)
import pytest

from controller.cli import main as cli
from simulator.studies import sweep

GRID = ["--gpus", "16", "--gpus-per-switch", "8", "--gpus-per-server", "4", "--oversubscription", "4",
        "--spare", "1", "--models", "V100:1", "--jobs", "12", "--policies", "fixed,regroup",
        "--schedulers", "fifo,backfill", "--loads", "0.5,0.8,1.2", "--seeds", "3"]


def test_a_grid_runs_on_a_local_dask_cluster_and_writes_the_study_table(tmp_path, capsys):
    out = tmp_path / "study"
    assert cli(["sweep", *GRID, "--workers", "2", "--no-plots", "--quiet", "--out", str(out)]) == 0
    with (out / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 2 * 2 * 3 * 3
    assert {r["run"] for r in runs} == {"fixed", "fixed+backfill", "regroup", "regroup+backfill"}
    table = json.loads((out / "study.json").read_text())["study"]
    assert len(table) == 4 * 3 and all(r["seeds"] == 3 for r in table)
    for r in table:  # each cell is the mean of its three seeds' runs, with a 95 % interval
        mine = [float(x["jct_mean_s"]) for x in runs if x["run"] == r["run"] and float(x["load"]) == r["load"]]
        assert r["jct_mean_s"] == pytest.approx(sum(mine) / 3)
        assert r["jct_mean_s_ci95"] >= 0
    assert any(r["jct_mean_s_ci95"] > 0 for r in table)  # the seeds differ
    # a higher load queues longer under fifo (the synthetic arrivals come faster)
    fifo = {r["load"]: r["queue_mean_s"] for r in table if r["run"] == "fixed"}
    assert fifo[1.2] > fifo[0.5]
    md = (out / "study.md").read_text()
    assert "| fixed+backfill | 0.8 |" in md and "±" in md
    assert "local Dask cluster of 2 worker(s)" in capsys.readouterr().out


def test_failures_are_one_more_axis_and_the_table_gives_goodput(tmp_path):
    out = tmp_path / "failures"
    # 4 servers, each failing every 0.1 h (360 s) on average and out for 36 s: the runs of 12 short jobs see some
    grid = [*GRID[:GRID.index("--policies")], "--policies", "fixed", "--schedulers", "fifo", "--loads", "0.9",
            "--seeds", "3", "--failures", "none,swap,scratch", "--server-mtbf-h", "0.1", "--repair-h", "0.01"]
    assert cli(["sweep", *grid, "--workers", "2", "--no-plots", "--quiet", "--out", str(out)]) == 0
    with (out / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 3 * 3 and {r["run"] for r in runs} == {"fixed", "fixed+swap", "fixed+scratch"}
    table = {r["run"]: r for r in json.loads((out / "study.json").read_text())["study"]}
    assert table["fixed"]["goodput"] == 1.0 and table["fixed"]["failures"] == "none"
    assert sum(int(r["server_failures"]) for r in runs if r["run"] == "fixed") == 0
    hit = [r for r in runs if r["run"] != "fixed"]
    assert all(int(r["server_failures"]) > 0 for r in hit) and any(int(r["interruptions"]) > 0 for r in hit)
    for run in ("fixed+swap", "fixed+scratch"):  # each cell the mean of its seeds' goodput
        mine = [float(r["goodput"]) for r in runs if r["run"] == run]
        assert table[run]["goodput"] == pytest.approx(sum(mine) / 3)
    assert min(table["fixed+swap"]["goodput"], table["fixed+scratch"]["goodput"]) < 1.0  # work was lost
    md = (out / "study.md").read_text()
    assert "goodput" in md and "| fixed+scratch | 0.9 |" in md and "a server fails every 0.1 h" in md


def test_the_same_grid_gives_the_same_study(tmp_path):
    tasks = sweep.grid(_args(tmp_path, "--loads", "0.9", "--seeds", "2", "--schedulers", "las",
                             "--failures", "none,swap", "--server-mtbf-h", "0.1", "--repair-h", "0.01"))
    a = sweep.run_grid(tasks, workers=1, processes=False)
    b = [sweep.run_task(t) for t in tasks]
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in a]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in b]


def _args(tmp_path, *more):
    import argparse

    parser = argparse.ArgumentParser()
    sweep.add_parser(parser.add_subparsers())
    return parser.parse_args(["sweep", *GRID, *more, "--out", str(tmp_path / "x")])


@pytest.mark.parametrize("flag, value, message", [
    ("--loads", "0.5,abc", "--loads: 'abc' is not a number"),
    ("--loads", "0,0.5", "must be a positive load"),
    ("--schedulers", "fifo,lottery", "--schedulers: unknown lottery"),
    ("--policies", "fixed,teleport", "--policies: unknown teleport"),
    ("--seeds", "0", "--seeds must be at least 1"),
    ("--gpus", "20", "--gpus 20 is not a multiple"),
    ("--failures", "none,meteor", "--failures: unknown meteor"),
    ("--swap-s", "-1", "--swap-s is in seconds and must be 0 or more, not -1"),
    ("--server-mtbf-h", "-1", "--server-mtbf-h is in hours and must be positive, not -1"),
    ("--mixes", "small,huge", "--mixes: unknown huge"),
    ("--oversubscriptions", "4,abc", "--oversubscriptions:"),
])
def test_bad_settings_exit_2_naming_what_is_wrong_and_write_nothing(tmp_path, capsys, flag, value, message):
    out = tmp_path / "nothing"
    assert cli(["sweep", *GRID, flag, value, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_oversubscription_and_job_size_mix_are_axes_and_a_mix_draws_only_its_sizes(tmp_path):
    tasks = sweep.grid(_args(tmp_path, "--oversubscriptions", "2,4", "--mixes", "small,field"))
    assert len(tasks) == 2 * 2 * 2 * 2 * 3 * 3  # oversubscriptions x mixes x policies x schedulers x loads x seeds
    assert {(t.oversubscription, t.mix) for t in tasks} == {(2.0, "small"), (2.0, "field"), (4.0, "small"),
                                                            (4.0, "field")}
    small = next(t for t in tasks if t.mix == "small")
    jobs = sweep.mixed_jobs(small, 16, {"vgg16": 1.0, "resnet50": 0.5})
    assert len(jobs) == 12 and {j.gpus for j in jobs} <= set(sweep.MIXES["small"])
    assert [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs)
    large = next(t for t in tasks if t.mix == "field")
    from dataclasses import replace
    with pytest.raises(ValueError, match="no job size within the rack's 8 GPUs"):
        sweep.mixed_jobs(replace(large, mix="large"), 8, {"vgg16": 1.0, "resnet50": 0.5})

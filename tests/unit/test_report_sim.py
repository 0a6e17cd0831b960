"""evidence/report/sim.py: each of make report's simulator blocks is rendered from its record (a synthetic one here,
so a changed figure changes the table), and a missing or bad record is an error naming the file."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evidence.report import engine as report
from evidence.report import sim as report_sim
from evidence.report.bench import ReportError

MAIN = ("| policy | JCT mean | JCT median | JCT p90 | queueing mean | makespan | GPUs held | GPUs computing "
        "| jobs spread / sharing a link | circuits changed | dark time | sim wall |")
FIELD = ("| policy | JCT mean / p50 / p95 / p99 | slowdown mean / p50 / p95 / p99 | queueing mean / p95 | makespan "
         "| steady held / computing | one switch's reach | vs fixed: JCT mean, p95, slowdown mean, steady computing |")


def _table(head: str, *rows: str) -> str:
    return "\n".join([head, "|" + " --- |" * (head.count("|") - 1), *rows]) + "\n"


def _summary(command: str = "optirack simulate --gpus 64", fixed_jct: str = "159 s") -> str:
    """A summary.md of two runs, fixed and defrag, as `optirack simulate` lays it out."""
    return (f"# optirack simulate: rack g64: 8 servers, 64 GPUs (64 x V100)\n\nCommand: `{command}`\n\n"
            + _table(MAIN, f"| fixed: today's cabling | {fixed_jct} | 92.1 s | 392 s | 11.0 s | 2,266 s | 54.4 % "
                           "| 24.6 % | 245 / 145 | 0 | 0.0 ms | 2.1 s |",
                     "| regroup + defragment every 300 s | 145 s | 83.0 s | 368 s | 5.9 s | 1,830 s | 57.3 % | 30.4 % "
                     "| 68 / 10 | 11,682 | 6.9 s | 1.2 s |")
            + "\n## The field's figures\n\n"
            + _table(FIELD, f"| fixed | {fixed_jct} / 84.3 s / 511 s / 711 s | 1.22 / 1.00 / 2.32 / 4.86 "
                            "| 9.2 s / 50.8 s | 1,878 s | 86.1 % / 47.7 % | 87 % | baseline |",
                     "| defrag | 151 s / 89.4 s / 527 s / 762 s | 1.28 / 1.00 / 2.60 / 5.47 | 928.7 ms / 62.7 s "
                     "| 1,974 s | 86.1 % / 48.5 % | 98 % | +2.8 %, +3.0 %, +4.9 %, -0.0 % |"))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_block_is_one_of_make_reports():
    assert set(report_sim.BLOCKS) <= set(report.BLOCKS)
    assert all(report.BLOCKS[n] is f for n, f in report_sim.BLOCKS.items())


def test_seeds_is_the_summarys_table_over_seeds_with_the_seeds_named(tmp_path):
    table = _table("| policy | JCT mean | JCT p95 | slowdown mean | steady computing | JCT mean vs static |",
                   "| static | 210 s ± 33.1 s | 596 s ± 167 s | 2.74 ± 0.65 | 45.6 % ± 3.3 % | baseline |",
                   "| ideal | 183 s ± 29.7 s | 530 s ± 58.0 s | 2.22 ± 1.09 | 48.9 % ± 7.8 % | -12.6 % ± 20.5 % |")
    _write(tmp_path / "simulate-1024-seeds" / "summary.md", "# x\n\n" + _table(MAIN, "| a |" + " 1 |" * 11)
           + "\n## Over seeds\n\nOver 2 seeds (4, 9): mean ± 95 % interval (Student's t).\n\n" + table)
    assert report_sim.sim_seeds([], tmp_path).splitlines() == [
        "| policy (seeds 4, 9, mean ± 95 % interval) | JCT mean | JCT p95 | slowdown mean | steady computing "
        "| JCT mean vs static |", "| --- | --- | --- | --- | --- | --- |",
        "| static | 210 s ± 33.1 s | 596 s ± 167 s | 2.74 ± 0.65 | 45.6 % ± 3.3 % | baseline |",
        "| ideal | 183 s ± 29.7 s | 530 s ± 58.0 s | 2.22 ± 1.09 | 48.9 % ± 7.8 % | −12.6 % ± 20.5 % |"]


def test_seeds_of_a_run_without_seeds_is_an_error(tmp_path):
    path = _write(tmp_path / "simulate-1024-seeds" / "summary.md", _summary())
    with pytest.raises(ReportError, match=f"{re.escape(str(path))}: no line matching"):
        report_sim.sim_seeds([], tmp_path)


JOBS = """policy,id,gpus,model,arrival_s,start_s,jct_s,shared,shift_s,mean_iteration_s
regroup,j1,12,resnet50,0.0,0.0,159.49,True,0.0,0.10633
regroup,j2,12,resnet50,0.0,0.0,159.61,True,0.0,0.10640
regroup,j3,4,vgg16,5.0,5.0,65.6,False,0.0,0.164
regroup,j6,12,resnet50,150.0,159.4,127.08,True,0.0,0.09799
regroup,j7,12,vgg16,150.0,159.6,128.01,True,0.0,0.19742
timeshift,j1,12,resnet50,0.0,0.0,134.50,True,0.0,0.08967
timeshift,j2,12,resnet50,0.0,0.0171,134.52,True,0.017099,0.08967
timeshift,j3,4,vgg16,5.0,5.0,65.6,False,0.0,0.164
timeshift,j6,12,resnet50,150.0,150.0,117.57,True,0.0,0.09797
timeshift,j7,12,vgg16,150.0,150.09,118.50,True,0.089226,0.19742
"""


def test_timeshift_pairs_the_jobs_that_shared_a_link_by_arrival(tmp_path):
    path = _write(tmp_path / "simulate-sample-timeshift" / "jobs.csv", JOBS)
    rows = report_sim.sim_timeshift([], tmp_path).splitlines()
    assert rows[0].startswith("| jobs (12 GPUs each) | mean iteration, regroup |")
    assert rows[2:] == [
        "| j1 + j2 (resnet50, start together) | 106.3 / 106.4 ms | 89.7 ms (shift 17.1 ms) | 159.5 / 159.6 s "
        "| 134.5 s |",
        "| j6 + j7 (resnet50 + vgg16) | 98.0 / 197.4 ms | 98.0 / 197.4 ms (shift 89.2 ms) | 127.1 / 128.0 s "
        "| 117.6 / 118.5 s |"]
    _write(path, JOBS.replace("0.0171,134.52", "0.0171,140.0"))
    assert "| 134.5 / 140.0 s |" in report_sim.sim_timeshift([], tmp_path)
    _write(path, JOBS.replace("timeshift,j7", "fixed,j7"))
    with pytest.raises(ReportError, match=f"{re.escape(str(path))}: not the jobs of a regroup and a timeshift run"):
        report_sim.sim_timeshift([], tmp_path)


def test_4096_takes_the_figures_from_the_main_table_and_the_names_from_the_fields(tmp_path):
    path = _write(tmp_path / "simulate-4096" / "summary.md", _summary())
    assert report_sim.sim_4096([], tmp_path).splitlines() == [
        "| policy | JCT mean | JCT median | JCT p90 | queueing mean | makespan | GPUs computing "
        "| jobs spread over switches | circuits changed |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        "| fixed | 159 s | 92.1 s | 392 s | 11.0 s | 2,266 s | 24.6 % | 245 | 0 |",
        "| regroup + defragment | 145 s | 83.0 s | 368 s | 5.9 s | 1,830 s | 30.4 % | 68 | 11,682 |"]
    _write(path, _summary(fixed_jct="160 s"))
    assert "| fixed | 160 s | 92.1 s |" in report_sim.sim_4096([], tmp_path)


def test_variants_a_row_per_record_checked_against_its_command(tmp_path):
    for record, options, _ in report_sim.VARIANTS:
        _write(tmp_path / record / "summary.md", _summary(f"optirack simulate --gpus 4096 {options} --no-plots"))
    rows = report_sim.sim_4096_variants([], tmp_path).splitlines()
    assert rows[0] == "| variant | fixed | regroup + defragment |"
    assert rows[2] == "| `--spare 1.25`: 8 spare downlinks per switch | 159 s, makespan 2,266 s | 145 s, 1,830 s |"
    assert rows[3] == ("| `--oversubscription 32 --spare 1.5`: uplinks at one NIC's rate | 159 s, 2,266 s "
                       "| 145 s, 1,830 s |")
    path = _write(tmp_path / report_sim.VARIANTS[1][0] / "summary.md", _summary("optirack simulate --spare 1.5"))
    with pytest.raises(ReportError, match=f"{re.escape(str(path))}: made by `optirack simulate --spare 1.5`, not with "
                                          "--oversubscription 32"):
        report_sim.sim_4096_variants([], tmp_path)


def test_schedulers_picks_the_fields_figures(tmp_path):
    _write(tmp_path / "simulate-256-schedulers" / "summary.md", _summary())
    assert report_sim.sim_schedulers([], tmp_path).splitlines()[2:] == [
        "| fixed | 159 s / 511 s | 1.22 | 9.2 s | 1,878 s | 47.7 % |",
        "| defrag | 151 s / 527 s | 1.28 | 928.7 ms | 1,974 s | 48.5 % |"]


BENCH = {"runs": [{"wall_s": 360.4}, {"wall_s": 342.8}], "wall_s": {"min": 342.8, "median": 351.6, "max": 360.4},
         "peak_rss_bytes": {"min": 1936470016, "median": 1956847616, "max": 1977225216},
         "peak_pss_bytes": {"min": 1811249152, "median": 1831603200, "max": 1851957248}, "out_bytes": 560899,
         "files": ["results.json", "summary.md"], "same_results": True, "within_limits": True}


def test_bench_is_the_records_spread_and_a_line_on_the_bound(tmp_path):
    path = _write(tmp_path / "bench-simulate.json", json.dumps(BENCH))
    text = report_sim.sim_bench([], tmp_path)
    assert text.splitlines()[:3] == ["| | min | median | max |", "| --- | --- | --- | --- |",
                                     "| end to end | 343 s | 352 s | 360 s |"]
    assert "| peak memory, RSS summed over the processes | 1,847 MiB | 1,866 MiB | 1,886 MiB |" in text
    assert " ".join(text.split("\n\n")[1].split()) == (
        "Runs: 360 s, 343 s; the same results every run (the same hash): True; written: 0.5 MiB (results.json, "
        "summary.md). Within 10 min and 2 GB: **yes**, 5.7–6.0 min and at most 1,886 MiB (the memory with less "
        "room than the time).")
    _write(path, json.dumps({**BENCH, "within_limits": False, "wall_s": {**BENCH["wall_s"], "max": 590.0}}))
    assert "**no**, 5.7–9.8 min and at most 1,886 MiB (the time with less room than the memory)" in " ".join(
        report_sim.sim_bench([], tmp_path).split())
    _write(path, json.dumps({k: v for k, v in BENCH.items() if k != "runs"}))
    with pytest.raises(ReportError, match=f"{re.escape(str(path))}: not a bench_simulate record"):
        report_sim.sim_bench([], tmp_path)


FAILURE = ("| run | server failures | interruptions | iterations redone | GPU-h lost | GPU-h restarting "
           "| GPU-h held | goodput |")


def test_failures_a_row_per_run_of_each_size(tmp_path):
    for record, gpus in zip(report_sim.FAILURES, (4096, 16384), strict=True):
        _write(tmp_path / record / "summary.md", f"# optirack simulate: rack g{gpus}: 2 servers, {gpus} GPUs (x)\n\n"
               + _table(FAILURE, f"| regroup+swap | {gpus // 1000} | 22 | 23,880 | 23.5 | 0.5 | 1,200 | 98.00 % |"))
    assert report_sim.sim_failures([], tmp_path).splitlines()[2:] == [
        "| 4,096 | regroup+swap | 4 | 22 | 23,880 | 23.5 | 0.5 | 1,200 | 98.00 % |",
        "| 16,384 | regroup+swap | 16 | 22 | 23,880 | 23.5 | 0.5 | 1,200 | 98.00 % |"]


@pytest.mark.parametrize("name", sorted(report_sim.BLOCKS))
def test_a_missing_record_is_an_error_naming_it(tmp_path, name):
    with pytest.raises(ReportError, match=re.escape(str(tmp_path)) + r"/.*: cannot read the record"):
        report_sim.BLOCKS[name]([], tmp_path)


@pytest.mark.parametrize("text, message", [
    (_summary().replace("| JCT p90 |", "| JCT p99 |"), r":5: the table has no column 'JCT p90'"),
    (_summary().replace("| 2,266 s | 54.4 % ", "| 2,266 s "), r":7: 11 cells in a row under a header of 12"),
    (_summary().replace("## The field's figures", "## Figures"), r": no line '## The field's figures'"),
    ("# nothing here\n", r": no table whose first column is 'policy'"),
])
def test_a_bad_summary_is_an_error_naming_the_file_and_what_is_wrong(tmp_path, text, message):
    path = _write(tmp_path / "simulate-4096" / "summary.md", text)
    with pytest.raises(ReportError, match=re.escape(str(path)) + message):
        report_sim.sim_4096([], tmp_path)


def test_readme_run_compares_each_point_of_case_a_and_a_missing_record_is_named(tmp_path):
    rows = report_sim.sim_readme_run([]).splitlines()
    assert [r.split(" | ")[0] for r in rows[2:]] == ["| 1:1", "| 1:2", "| 1:4", "| 1:8"]
    assert rows[2].startswith("| 1:1 | 0.321 s | 0.360 s (+12.3 %) | 0.312 s (−2.8 %) | 0.298 s |")
    with pytest.raises(ReportError, match="demo-readme-run.json: cannot read the record"):
        report_sim.sim_readme_run([], tmp_path)


def test_sweep_gain_pairs_each_seed_and_gives_mean_min_and_max(tmp_path):
    head = "policy,seed,load,mix,oversubscription,jct_mean_s\n"
    rows = ["fixed,1,0.9,field,32,100", "regroup,1,0.9,field,32,80", "fixed,2,0.9,field,32,200",
            "regroup,2,0.9,field,32,190", "fixed,1,0.9,field,4,100", "regroup,1,0.9,field,4,101"]
    _write(tmp_path / "sweep-gain" / "runs.csv", head + "\n".join(rows) + "\n")
    assert report_sim.sim_sweep_gain([], tmp_path).splitlines() == [
        "| load | job sizes | 4:1 | 32:1 |", "| --- | --- | --- | --- |",
        "| 0.9 | field | -1.0 % (-1.0 to -1.0) | +12.5 % (+5.0 to +20.0) |"]
    _write(tmp_path / "sweep-gain" / "runs.csv", head + "fixed,1,0.9,field,32,100\n")
    with pytest.raises(ReportError, match="not an optirack sweep's runs.csv"):
        report_sim.sim_sweep_gain([], tmp_path)


def test_bench_against_the_commit_before_shows_both_the_speed_up_and_whether_the_figures_held(tmp_path):
    before = {"commit": "a" * 40, "runs": [], "wall_s": {"min": 700.0, "median": 720.0, "max": 740.0},
              "peak_rss_bytes": {k: 2 * 2**30 for k in ("min", "median", "max")},
              "peak_pss_bytes": {k: 2**30 for k in ("min", "median", "max")}}
    record = {**BENCH, "commit": "b" * 40, "before": before, "speedup": 720.0 / 351.6, "same_results_as_before": True}
    _write(tmp_path / "bench-simulate.json", json.dumps(record))
    text = report_sim.sim_bench([], tmp_path)
    assert "| end to end, bbbbbbb | 343 s | 352 s | 360 s |" in text
    assert "| end to end, aaaaaaa (the commit before, run just before each) | 700 s | 720 s | 740 s |" in text
    assert "| peak memory, RSS summed, aaaaaaa | 2,048 MiB | 2,048 MiB | 2,048 MiB |" in text
    assert "bbbbbbb against aaaaaaa: **2.05x** as fast (median over median); every run's figures the same as the " \
           "commit before's (the same hash): **yes**." in " ".join(text.split())
    _write(tmp_path / "bench-simulate.json", json.dumps({**record, "same_results_as_before": False}))
    assert "(the same hash): **no**." in " ".join(report_sim.sim_bench([], tmp_path).split())

"""evidence/report/bench.py: make report's benchmark blocks are rendered from their records (synthetic ones here, so a
changed figure changes the table), and a missing or bad record is an error naming it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence.report import bench as report_bench
from evidence.report import engine as report
from evidence.report import failover as report_failover
from evidence.report.bench import ReportError


def _bench(directory: Path, stem: str, name: str, results) -> Path:
    path = directory / f"{stem}-{name}.json"
    path.write_text(json.dumps({"command": [name], "results": results}))
    return path


def _spread(*xs: float) -> dict:
    s = sorted(xs)
    return {"n": len(s), "min": s[0], "median": s[len(s) // 2], "max": s[-1], "values": list(xs)}


def test_every_block_is_one_of_make_reports():
    assert all(report.BLOCKS[n] is f for n, f in report_bench.BLOCKS.items())


def _round(total: float, state: str = "done") -> dict:
    return {"state": state, "recoveries": 1, "total_s": total, "detection_s": 0.02, "planning_s": 0.46,
            "ocs_s": 0.03, "containers_s": 0.8, "restore_s": 2.0, "rendezvous_s": 0.1}


def test_failover_gives_p50_and_max_per_phase_per_fault_and_counts_the_rounds_that_ended_done(tmp_path):
    for fault, name in report_failover.FAILOVER.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        extra = {"back_s": 1.5} if fault == "restart" else {}
        woke = {"woke": {"swept_s": 2.0, "recorded_after_wake": 0}} if fault == "hang" else {}
        (tmp_path / name).write_text(json.dumps({"results": {"fault": fault, "rounds": [
            {**_round(3.0), **extra, **woke}, {**_round(3.5), **extra, "replans": 1}, _round(4.0)]}}))
    table = report_failover.failover([], tmp_path).splitlines()
    assert table[0].startswith("| from the fault: p50 / max of the rounds (3 each) | a server killed |"), table[0]
    assert table[8] == "| **all ranks iterating again** |" + " **3.50** / 4.00 s |" * 5, table[8]
    assert table[9] == "| from the controller back to every rank iterating |" + " – |" * 4 + " 1.50 / 1.50 s |"
    assert table[10] == "| rounds that ended `done` after one recovery |" + " 3 of 3 |" * 5
    assert table[12] == "| rounds whose recovery planned again (a loss met mid-way) |" + " 1 of 3 |" * 5
    assert table[13].endswith("| – | – | – | 2.00 / 2.00 s; 0 | – |"), table[13]
    assert "| planning (a sure sign, the lost workers stopped, spares chosen) | 0.46 / 0.46 s |" in table[3]


def test_failover_without_its_record_names_the_file(tmp_path):
    with pytest.raises(ReportError, match="server.json: cannot read the record"):
        report_failover.failover([], tmp_path)
    (tmp_path / "failover").mkdir()
    (tmp_path / "failover" / "server.json").write_text(json.dumps({"results": {"fault": "server"}}))
    with pytest.raises(ReportError, match=r"server.json: the record has no results.rounds"):
        report_failover.failover([], tmp_path)


def test_checkpoint_cost_names_the_gpus_models_and_each_pairs_cost(tmp_path):
    for name, gpus in zip(report_bench.CHECKPOINT_COST, (["gpu1", "gpu2"], ["gpu5", "gpu6"]), strict=True):
        (tmp_path / name).write_text(json.dumps({"results": {
            "gpus": gpus, "checkpoint_every": 20, "pairs": [{"cost": 0.0125}, {"cost": -0.003}],
            "median": {"mean_iteration_s_with": 0.6213, "mean_iteration_s_without": 0.618, "local_s": 0.0012,
                       "save_s": 0.194}}}))
    rows = report_bench.checkpoint_cost([], tmp_path).splitlines()[2:]
    assert rows[0] == ("| `bench-checkpoint-cost.json` | 2 x M40 (K = 20) | 0.621 / 0.618 s | +1.25 %, -0.30 % "
                       "| 1.2 ms / 0.194 s |")
    assert rows[1].startswith("| `bench-checkpoint-cost-titanv.json` | 2 x Titan V (K = 20) |")


def test_placement_gives_the_range_of_the_runs_medians_and_the_largest_time(tmp_path):
    def row(kind, size, med, mx):
        return {"gpus": 1024, "switches": 32, "ocs": 4, "kind": kind, "job_gpus": size, "median_ms": med,
                "min_ms": 0.01, "max_ms": mx}

    _bench(tmp_path, "20260101T000000Z-aaaaaaa", "bench_placement", [row("count", 8, 0.04, 0.1),
                                                                      row("count", 32, 0.2, 0.3)])
    _bench(tmp_path, "20260101T000100Z-aaaaaaa", "bench_placement", [row("count", 8, 0.06, 0.13),
                                                                      row("count", 32, 0.1, 0.44)])
    lines = report_bench.placement([], tmp_path).splitlines()
    assert lines[0] == "| GPUs (switches, OCS) | job | 8 GPUs: median (max) | 32 GPUs |"
    assert lines[2] == "| 1,024 (32, 4) | count | 0.04–0.06 ms (0.13) | 0.10–0.20 ms (0.44) |"
    assert lines[-2].startswith("From 2 runs: `20260101T000000Z-aaaaaaa-bench_placement.json`")


def test_store_gives_each_size_and_the_ratio_range(tmp_path):
    for i, (small, large) in enumerate(((0.5, 0.3), (0.4, 0.34))):
        _bench(tmp_path, f"20260101T00000{i}Z-aaaaaaa", "bench_store", {
            "saves": 200, "ratio_largest_to_smallest": round(large / small, 3),
            "sizes": [{"recorded_jobs": 10, "save_ms": _spread(0.3, small, 50.0)},
                      {"recorded_jobs": 10000, "save_ms": _spread(0.2, large, 1.7)}]})
    lines = report_bench.store([], tmp_path).splitlines()
    assert lines[2] == "| 10 | 0.40–0.50 ms | 0.30 / 50.0 ms |  |"
    assert lines[3] == "| 10,000 | 0.30–0.34 ms | 0.20 / 1.7 ms | 0.60–0.85 |"
    assert lines[-1].endswith("200 saves per size each.")


def test_observed_is_one_column_per_run_and_a_record_without_it_is_named(tmp_path):
    _bench(tmp_path, "20260101T000000Z-aaaaaaa", "bench_allreduce-observed", {"observed": {
        "plain_percent": [96.0, 96.5, 96.7], "observed_percent": [96.0, 96.0, 96.0], "plain_mean_percent": 96.4,
        "observed_mean_percent": 96.0, "difference_points": 0.4}})
    lines = report_bench.observed([], tmp_path).splitlines()
    assert lines[0] == "| | run 1 |"
    assert lines[4] == "| difference (without − with) | +0.4 percentage points |"
    _bench(tmp_path, "20260102T000000Z-aaaaaaa", "bench_allreduce-observed", {"ring": []})
    with pytest.raises(ReportError, match="20260102T000000Z-aaaaaaa-bench_allreduce-observed.json: the record has "
                                          "no 'observed'"):
        report_bench.observed([], tmp_path)


def test_rack_shows_the_images_and_the_times_per_record(tmp_path):
    _bench(tmp_path, "20260101T000000Z-aaaaaaa", "bench_rack", {
        "image_bytes": {"worker": 891_000_000, "nic_helper": 10_200_000}, "cold_up_s": 79.2,
        "up_s": _spread(7.7, 7.8, 9.0), "down_s": _spread(3.1, 3.3, 4.0)})
    lines = report_bench.rack([], tmp_path).splitlines()
    assert lines[2] == "| worker image | 891 MB |" and lines[3] == "| NIC helper image | 10 MB |"
    assert lines[4].endswith("| 79.2 s |")
    assert lines[5].endswith("| 7.8 s (7.7–9.0, 3 runs) |")


@pytest.mark.parametrize("block", ["placement", "store", "observed", "rack"])
def test_a_block_with_no_committed_record_says_which_benchmark_to_run(tmp_path, block):
    with pytest.raises(ReportError, match="no committed bench_.* record under .* \\(run it with --json\\)"):
        report_bench.BLOCKS[block]([], tmp_path)


def _quick(tmp_path: Path, name: str, driver: str, saving: float) -> None:
    data = json.loads(next(report_bench.QUICK.glob("*.json")).read_text())
    data["rack"]["ocs"][0]["driver"] = driver
    data["points"][0]["saving"]["median"] = saving
    (tmp_path / f"{name}.json").write_text(json.dumps(data))


def test_netconf_quick_judges_each_netconf_run_against_the_openflow_runs_range(tmp_path):
    for i, (driver, saving) in enumerate([("openflow", 0.70), ("netconf", 0.71), ("openflow", 0.73),
                                          ("netconf", 0.69), ("netconf", 0.73)]):
        _quick(tmp_path, f"2027010{i}T000000Z-abcdef0", driver, saving)
    text = report_bench.netconf_quick([], tmp_path)
    assert text.count("| NETCONF |") == 3 and text.count("| OpenFlow |") == 2
    assert "(70.0–73.0 %)" in text and "2 of 3 within the OpenFlow runs' range" in " ".join(text.split())


def test_netconf_quick_without_both_drivers_says_so(tmp_path):
    _quick(tmp_path, "20270101T000000Z-abcdef0", "openflow", 0.7)
    with pytest.raises(ReportError, match="both drivers"):
        report_bench.netconf_quick([], tmp_path)


def test_failover_counts_a_round_that_never_recovered_as_never_in_the_worst(tmp_path):
    lost = {"job": "job-3", "state": "failed", "failed": "timed out after 120 s", "recoveries": 0}
    for fault, name in report_failover.FAILOVER.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(json.dumps({"results": {"fault": fault, "rounds": [
            _round(0.5), _round(0.6), _round(0.7), lost]}}))
    table = report_failover.failover([], tmp_path).splitlines()
    assert "| **all ranks iterating again** | **0.60** / not reached (1 of 4) |" in table[8], table[8]
    assert table[10] == "| rounds that ended `done` after one recovery |" + " 3 of 4 |" * 5
    assert "| planning (a sure sign, the lost workers stopped, spares chosen) | 0.46 / 0.46 s |" in table[3]


def test_netconf_quick_compares_the_runs_of_each_commit_apart(tmp_path):
    for i, (commit, driver, saving) in enumerate([("aaaaaaa", "openflow", 0.70), ("aaaaaaa", "netconf", 0.60),
                                                  ("bbbbbbb", "openflow", 0.73), ("bbbbbbb", "netconf", 0.72),
                                                  ("bbbbbbb", "openflow", 0.71)]):
        _quick(tmp_path, f"2027010{i}T000000Z-{commit}", driver, saving)
        path = tmp_path / f"2027010{i}T000000Z-{commit}.json"
        data = json.loads(path.read_text())
        data["versions"]["optirack"] = commit
        path.write_text(json.dumps(data))
    text = " ".join(report_bench.netconf_quick([], tmp_path).split())
    assert "At aaaaaaa: OpenFlow 1 run, saved 70.0 %" in text and "0 of 1 within" in text
    assert "At bbbbbbb: OpenFlow 2 runs, saved 72.0 %" in text and "(71.0–73.0 %)" in text and "1 of 1 within" in text


def test_failover_trace16_counts_the_rounds_done_under_one_switch_and_names_the_swaps(tmp_path):
    for fault, name in report_failover.TRACE16.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        rounds = [{**_round(1.0), "spares": {"gpu1": "gpu7"}, "switches_after": ["as1"]},
                  {**_round(2.0), "spares": {"gpu5": "gpu7"}, "switches_after": ["as1", "as2"]}]
        if fault == "restart":
            rounds = [{**r, "back_s": 0.5} for r in rounds]
        (tmp_path / name).write_text(json.dumps({"results": {"fault": fault, "rounds": rounds}}))
    rows = report_failover.failover_trace16([], tmp_path).splitlines()
    assert rows[2] == "| a cascade (workers, then daemons) | 1 of 2 | gpu1 -> gpu7; gpu5 -> gpu7 | 1.50 / 2.00 s | – |"
    assert rows[4].endswith("| 1.50 / 2.00 s | 0.50 / 0.50 s |"), rows[4]


def test_reconfig_netconf_sets_each_netconf_row_beside_openflow_s_in_the_same_run(tmp_path, monkeypatch):
    split = {"driver_ms_median": 60.0, "rpc_ms_median": dict.fromkeys(
        ("lock", "edit-config", "commit", "get-config", "confirm", "unlock"), 1.0), "client_ms_median": 2.0,
        "switching_wait_ms_median": 0.0, "agent_after_commit_ms_median": 50.0,
        "cpu_ms_per_change": {"netconfd": 40.0, "front": 1.0, "ssh": 1.5, "agent": 8.0, "agent_ovs_ofctl": 12.5}}
    _bench(tmp_path, "20990101T000000Z-abc1234", "bench_reconfig", [
        {"driver": "openflow", "circuits": 512, "e2e_overhead_median_ms": 31.4},
        {"driver": "netconf", "circuits": 512, "e2e_overhead_median_ms": 58.7, "netconf": split},
        {"driver": "netconf", "circuits": 2, "e2e_overhead_median_ms": 20.0, "netconf": split}])
    monkeypatch.setattr(report_bench, "BENCH", tmp_path)
    rows = report_bench.reconfig_netconf([]).splitlines()[2:]
    assert "| 512 circuits | 58.7 ms (31.4 ms) | 60.0 ms |" in rows[0]
    assert "40.0, 1.0, 1.5, 8.0 (+12.5) ms" in rows[0]
    assert "| 2 circuits | 20.0 ms (none) |" in rows[1]  # no OpenFlow row of that size in the run
    assert rows[0].startswith("| `20990101T000000Z-abc1234` |")
    _bench(tmp_path, "20990101T000000Z-abc1234", "bench_reconfig", [
        {"driver": "netconf", "circuits": 512, "e2e_overhead_median_ms": 58.7,
         "netconf": {**split, "next_change_after_agent": True}}])
    assert report_bench.reconfig_netconf([]).splitlines()[2].startswith("| `20990101T000000Z-abc1234`* |")

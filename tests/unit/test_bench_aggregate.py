"""scripts/bench_aggregate.py's pure parts: a run's figures from the workers' lines, the summary of a run list, the
order of the runs, and make report's block from a record."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence.report import aggregation as block
from scripts import bench_aggregate as b

ROOT = Path(__file__).resolve().parents[2]


def lines(collective: str, comm: list[list[float]], compute: float = 0.4, check: str = "ok") -> dict:
    """Each rank's lines: start, one iteration per entry of comm[rank], done."""
    out = {}
    for rank, cs in enumerate(comm):
        out[f"gpu{rank + 1}"] = (
            [{"event": "start", "rank": rank, "collective": collective}]
            + [{"event": "iteration", "rank": rank, "iteration": i, "comm_s": c, "iter_s": compute + c}
               for i, c in enumerate(cs)]
            + [{"event": "done", "rank": rank, "check": check}])
    return out


def test_a_run_takes_the_slowest_rank_of_each_iteration_and_leaves_the_first_out():
    f = b.run_figures(lines("aggregate", [[9.0, 0.1, 0.3, 0.2], [9.0, 0.2, 0.1, 0.1]]))
    # per iteration the slowest rank: 0.2, 0.3, 0.2 (the first, 9.0, left out): median 0.2
    assert f["iterations"] == 3 and f["all_reduce_s"] == pytest.approx(0.2)
    assert f["iteration_s"] == pytest.approx(0.6)
    assert f["exact_sums"] and f["collective_run"] == "aggregate" and f["round_trip_ms"] is None
    trips = lines("aggregate", [[0.1, 0.2], [0.1, 0.2]])
    for rank, ms in enumerate((4.0, 6.0)):
        trips[f"gpu{rank + 1}"].append({"event": "aggregated", "round_trip": {"count": 9, "p10_ms": ms - 1,
                                                                              "median_ms": ms, "p90_ms": ms + 3}})
    assert b.run_figures(trips)["round_trip_ms"] == {"p10_ms": 4.0, "median_ms": 5.0, "p90_ms": 8.0}
    assert f["chunks"] is None
    trips["gpu1"][-1].update(sent=10, resent=2, received=10, ignored=1, dropped=0)
    assert b.run_figures(trips)["chunks"] == {"gpu1": {"sent": 10, "resent": 2, "received": 10, "ignored": 1,
                                                       "dropped": 0}, "gpu2": {}}
    bad = lines("ring", [[0.1, 0.1], [0.1, 0.1]])
    bad["gpu2"][-1]["check"] = "wrong"
    bad["gpu2"][0]["collective"] = "aggregate"
    f = b.run_figures(bad)
    assert not f["exact_sums"] and f["collective_run"] == "mixed"
    del bad["gpu1"][0], bad["gpu2"][0]
    assert b.run_figures(bad)["collective_run"] == "no start line"
    with pytest.raises(ValueError, match="gpu1: no iteration line"):
        b.run_figures({"gpu1": [{"event": "start"}]})


def test_lines_are_gathered_over_reads_without_heartbeats_or_repeats():
    seen: dict = {}
    b.gather(seen, {"gpu1": ['{"event": "start"}', '{"event":"alive","t":1}', '{"event": "iteration", "i": 0}']})
    b.gather(seen, {"gpu1": ['{"event": "iteration", "i": 0}', '{"event": "done"}', "no JSON", "{truncated"]})
    assert list(seen["gpu1"]) == ['{"event": "start"}', '{"event": "iteration", "i": 0}', '{"event": "done"}']


def fake_runs() -> list[dict]:
    runs = []
    for i, c in enumerate(b.order(3)):
        comm = 0.27 if c == "ring" else 0.12
        f = b.run_figures(lines(c, [[1.0, comm, comm + 0.02 * (i % 2)]] * 4))
        runs.append({"collective": c, "job": f"j{i}", "switches": ["as1"], "aggregation": None, **f})
    return runs


def test_the_summary_of_alternating_runs():
    assert b.order(2) == ["ring", "aggregate", "aggregate", "ring"]
    runs = fake_runs()
    s = b.summarise(runs, 2.0, {"ring": 0.34, "aggregate": 0.26})
    assert s["ring"]["runs"] == 3 and s["ring"]["all_reduce_s"] == pytest.approx(0.27)
    # each run's median of two iterations (comm, comm + 0.02 in odd runs): aggregate 0.13, 0.12, 0.13
    assert s["all_reduce_speedup"] == pytest.approx(0.27 / 0.13)
    assert s["aggregate"]["iteration_rack_s"] == pytest.approx(0.265)  # (0.4 + 0.13) / 2
    assert s["iteration_speedup"] == pytest.approx(0.335 / 0.265)
    assert s["predicted_iteration_speedup"] == pytest.approx(0.34 / 0.26)
    assert runs[0]["error"] == pytest.approx(0.335 / 0.34 - 1)
    assert s["checks"] == {"all_reduce_at_least_bar": True, "every_run_within_tolerance": True,
                           "exact_sums": True, "ran_as_asked": True}
    far = b.summarise(fake_runs(), 2.0, {"ring": 0.30, "aggregate": 0.26}, bar=2.5)
    assert far["checks"]["all_reduce_at_least_bar"] is False  # 2.08x under a bar of 2.5x
    assert far["checks"]["every_run_within_tolerance"] is False  # 0.335 against 0.30: +11.7 %
    assert far["worst_error"] == pytest.approx(0.34 / 0.30 - 1)  # the fourth run: (0.4 + 0.28) / 2
    with pytest.raises(ValueError, match="no aggregate run"):
        b.summarise([r for r in fake_runs() if r["collective"] == "ring"], 2.0, {"ring": 1, "aggregate": 1})


DUMP = """OFPST_PORT reply (OF1.3) (xid=0x2): 1 ports
  port  11: rx pkts=1200, bytes={rx}, drop=0, errs=0, frame=0, over=0, crc=0
           tx pkts=1100, bytes={tx}, drop=0, errs=0, coll=0
           duration=12.5s
"""


def test_a_nics_bytes_come_from_its_switch_ports_counters_in_units_of_the_gradient():
    assert b.port_counters(DUMP.format(rx=1500, tx=900)) == (1500, 900)
    with pytest.raises(ValueError, match="no byte counters"):
        b.port_counters("ovs-ofctl: as1 is not a bridge or a socket")
    nic = b.nic_bytes({"gpu1": (1000, 500), "gpu2": (0, 0)}, {"gpu1": (1000 + 3000, 500 + 4500), "gpu2": (2000, 2000)},
                      gradient_bytes=1000, iterations=2)
    assert nic["gpu1"] == {"sent": 3000, "received": 4500, "sent_s": 1.5, "received_s": 2.25}
    assert nic["gpu2"]["sent_s"] == 1.0
    with pytest.raises(ValueError, match="gpu1: its port's counters went back"):
        b.nic_bytes({"gpu1": (10, 10)}, {"gpu1": (5, 20)}, 1000, 2)
    assert b.expected_factor("aggregate", 4) == 1.0 and b.expected_factor("ring", 4) == 1.5
    assert b.expected_factor("ring", 2) == 1.0


def test_the_counters_are_read_after_the_revalidators_have_passed_twice(monkeypatch):
    """Patch ports get their bytes when ovs-vswitchd's revalidators pass: read before that, a run's last iteration
    would be counted in the next run."""
    calls = []

    def run(cmd, **_kw):
        calls.append(tuple(cmd))
        return type("P", (), {"stdout": DUMP.format(rx=7, tx=9), "returncode": 0})()

    monkeypatch.setattr(b.subprocess, "run", run)
    assert b.counters({"gpu1": ("as1", 1), "gpu2": ("as2", 1)}) == {"gpu1": (7, 9), "gpu2": (7, 9)}
    assert calls[:2] == [b.SETTLE, b.SETTLE]
    assert [c[-2:] for c in calls[2:]] == [("as1", "1"), ("as2", "1")]


def with_bytes(runs: list[dict], factor: dict[str, float]) -> list[dict]:
    """Each run's NICs at `factor[collective]` S each way (the first NIC 3 % over in sending)."""
    for r in runs:
        f = factor[r["collective"]]
        r["nic"] = {f"gpu{i}": {"sent": 0, "received": 0, "sent_s": f * (1.03 if i == 1 else 1.0), "received_s": f}
                    for i in range(1, 5)}
    return runs


def test_the_bytes_each_way_are_checked_against_the_bound_of_each_collective():
    s = b.summarise(with_bytes(fake_runs(), {"ring": 1.52, "aggregate": 1.01}), 2.0, {"ring": 0.34, "aggregate": 0.26})
    assert s["aggregate"]["bytes"]["expected_s"] == 1.0 and s["ring"]["bytes"]["expected_s"] == 1.5
    assert s["ring"]["bytes"]["sent_s"] == {"min": 1.52, "median": 1.52, "max": pytest.approx(1.52 * 1.03)}
    assert s["checks"]["bytes_as_bound"] is True
    ring_as_aggregate = b.summarise(with_bytes(fake_runs(), {"ring": 1.0, "aggregate": 1.0}), 2.0,
                                    {"ring": 0.34, "aggregate": 0.26})  # a ring carrying S: not the 4-GPU ring
    assert ring_as_aggregate["checks"]["bytes_as_bound"] is False and ring_as_aggregate["ring"]["bytes"]["within"] \
        is False and ring_as_aggregate["aggregate"]["bytes"]["within"] is True
    assert "bytes_as_bound" not in b.summarise(fake_runs(), 2.0, {"ring": 0.34, "aggregate": 0.26})["checks"]


def test_at_two_gpus_there_is_no_bar_and_the_record_says_whether_a_gain_was_seen():
    s = b.summarise(fake_runs(), 2.0, {"ring": 0.34, "aggregate": 0.26}, bar=None, n=2)
    assert "all_reduce_at_least_bar" not in s["checks"] and s["gain_seen"] is True  # 0.27 against 0.13
    same = fake_runs()
    for r in same:
        r["all_reduce_s"] = 0.2
    assert b.summarise(same, 2.0, {"ring": 0.34, "aggregate": 0.26}, bar=None, n=2)["gain_seen"] is False
    assert "gain_seen" not in b.summarise(fake_runs(), 2.0, {"ring": 0.34, "aggregate": 0.26})


def test_the_matrix_and_its_cabling():
    m = b.matrix([2, 4], ["vgg16", "resnet50"], ["one", "spread"])
    assert len(m) == 8 and m[0] == {"n": 2, "model": "vgg16", "placement": "one"}
    assert m[-1] == {"n": 4, "model": "resnet50", "placement": "spread"}
    gpus = ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert b.cabling("one", gpus, ["as1", "as2"]) == {"as1": gpus}
    assert b.cabling("spread", gpus, ["as1", "as2"]) == {"as1": ["gpu1", "gpu2"], "as2": ["gpu3", "gpu4"]}
    assert b.cabling("spread", gpus[:2], ["as1", "as2"]) == {"as1": ["gpu1"], "as2": ["gpu2"]}
    with pytest.raises(ValueError, match="placement 'everywhere'"):
        b.cabling("everywhere", gpus, ["as1", "as2"])
    with pytest.raises(ValueError, match="spread needs 2 switches"):
        b.cabling("spread", gpus, ["as1"])
    rack, circuits = b.cabled_rack(ROOT / "topologies" / "paper-testbed.yaml", {"as1": ["gpu1"], "as2": ["gpu2"]})
    from controller.core.circuits import CircuitMap
    where = CircuitMap.parse(rack, circuits).gpu_locations(rack)  # the cabled rack: the simulator's start
    assert {g: at[0] for g, at in where.items() if g in ("gpu1", "gpu2")} == {"gpu1": "as1", "gpu2": "as2"}
    assert CircuitMap.initial(rack).gpu_locations(rack)["gpu2"] == where["gpu2"]


def test_the_report_block_renders_a_record_and_says_when_there_is_none(tmp_path):
    assert block.bench([], tmp_path).startswith("No record yet")
    runs = fake_runs()
    s = b.summarise(runs, 2.0, {"ring": 0.34, "aggregate": 0.26})
    record = {"results": {"model": "vgg16", "gpus": ["gpu1", "gpu2", "gpu3", "gpu4"], "switch": "as1",
                          "iterations": 3, "simulator": "calibrated", "runs": runs, "summary": s}}
    (tmp_path / "20261129T000000Z-abc1234-bench_aggregate.json").write_text(json.dumps(record))
    text = block.bench([], tmp_path)  # a record made before the matrix: 4 GPUs under one switch, no counters
    assert "| 4 × vgg16 | one (as1: gpu1, gpu2, gpu3, gpu4) | aggregate | 3 | 130 ms | 265 ms | 260 ms |" in text
    assert f"| not counted | {s['all_reduce_speedup']:.2f}× / {s['iteration_speedup']:.2f}× (1.31×) |" in text
    runs2 = with_bytes(fake_runs(), {"ring": 1.0, "aggregate": 1.0})
    two = b.summarise(runs2, 2.0, {"ring": 0.34, "aggregate": 0.3}, bar=None, n=2)
    matrix = {"results": {"iterations": 3, "repeats": 3, "configs": [
        {"n": 2, "model": "resnet50", "placement": "spread", "gpus": ["gpu1", "gpu2"],
         "under": {"as1": ["gpu1"], "as2": ["gpu2"]}, "simulator": "calibrated", "runs": runs2,
         "summary": two}]}}
    (tmp_path / "20261129T000002Z-abc1234-bench_aggregate.json").write_text(json.dumps(matrix))
    text = block.bench([], tmp_path)
    assert "| 2 × resnet50 | spread (as1: gpu1; as2: gpu2) | ring |" in text
    assert "| 1.00 (1.00–1.03) / 1.00 S (bound 1.00 S) |" in text and "; a gain seen |" in text
    assert "every_run_within_tolerance" not in text and "failed: `20261129T000002Z-abc1234` 2 × resnet50 spread: " \
        "every run within tolerance" in " ".join(text.split())
    (tmp_path / "20261129T000001Z-abc1234-bench_aggregate.json").write_text(json.dumps({"results": {}}))
    with pytest.raises(block.ReportError, match="not a bench_aggregate record"):
        block.bench([], tmp_path)


# --- scripts/aggregate_losses.py -------------------------------------------------------------------------------
def real_run(job: str, collective: str, losses: list[list[float]], norm: float = 1.0) -> dict:
    """A real-mode run's record: each rank's iterations with these losses (and one gradient norm), start and done."""
    lines = {}
    for rank, ls in enumerate(losses):
        lines[f"gpu{rank + 1}"] = (
            [{"event": "start", "collective": collective}]
            + [{"event": "iteration", "iteration": i, "loss": x, "grad_norm": norm, "comm_s": 0.1, "iter_s": 0.5}
               for i, x in enumerate(ls)] + [{"event": "done", "check": "ok"}])
    return {"collective": collective, "job": job, **b.run_figures(lines), "lines": lines}


def test_losses_are_compared_rank_by_rank_and_iteration_by_iteration_with_the_first_ring(tmp_path):
    from scripts import aggregate_losses as al

    ring = [[2.3, 2.2, 2.1], [2.4, 2.3, 2.2]]
    near = [[2.3, 2.2, 2.1 * (1 + 3e-7)], [2.4, 2.3, 2.2]]
    runs = [real_run("j1", "ring", ring), real_run("j2", "aggregate", near, norm=1 + 2e-6),
            real_run("j3", "ring", ring)]
    s = al.summarise(runs, tolerance=1e-5)
    assert runs[0]["against_ring"] is None and s["reference"] == "j1"
    a = runs[1]["against_ring"]
    assert a["compared"] == 6 and a["loss_identical"] == 5 and a["unmatched"] == []
    assert a["loss_max_relative"] == pytest.approx(3e-7, rel=1e-3)
    assert s["aggregate"]["grad_norm_max_relative"] == pytest.approx(2e-6, rel=1e-3)
    assert s["ring"]["loss_max_relative"] == 0 and all(s["checks"].values())
    far = [real_run("j1", "ring", ring), real_run("j2", "aggregate", [[2.3, 2.2, 2.1 * 1.001], ring[1][:2]])]
    s = al.summarise(far, tolerance=1e-5)  # one loss 1e-3 off, and rank 1's last iteration missing
    assert s["checks"]["aggregate_within_tolerance"] is False and s["checks"]["every_iteration_compared"] is False
    assert far[1]["against_ring"]["unmatched"] == ["gpu2:2"]
    with pytest.raises(ValueError, match="a ring run and an aggregate run"):
        al.summarise([real_run("j1", "ring", ring)])
    record = {"results": {"model": "small CNN", "gpus": ["gpu1", "gpu2"], "switch": "as1", "order": ["ring"] * 2,
                          "workload": {"iterations": 3, "batch": 8}, "runs": far, "summary": s}}
    assert block.losses([], Path("/nonexistent")).startswith("No record yet")
    for r in far:
        del r["lines"]
    (tmp_path / "20261129T000000Z-abc1234-aggregate_losses.json").write_text(json.dumps(record))
    text = block.losses([], tmp_path)
    assert "| j2 | aggregate | 1.0e-03 | 0.0e+00 | 4 of 5 | yes | 100 ms |" in text
    assert "failed: aggregate within tolerance, every iteration compared" in " ".join(text.split())


def test_the_bar_is_set_at_four_gpus_and_more_under_one_switch_only():
    assert b.bar_for({"n": 4, "placement": "one", "model": "vgg16"}) == b.BAR
    assert b.bar_for({"n": 8, "placement": "one", "model": "resnet50"}) == b.BAR
    assert b.bar_for({"n": 2, "placement": "one", "model": "vgg16"}) is None
    assert b.bar_for({"n": 4, "placement": "spread", "model": "vgg16"}) is None  # 2 S on the uplink against 1.5 S

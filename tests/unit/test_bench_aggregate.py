"""scripts/bench_aggregate.py's pure parts: a run's figures from the workers' lines, the summary of a run list, the
order of the runs, and make report's block from a record."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence.report import aggregation as block
from scripts import bench_aggregate as b


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
    assert f["exact_sums"] and f["collective_run"] == "aggregate"
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


def test_the_report_block_renders_a_record_and_says_when_there_is_none(tmp_path):
    assert block.bench([], tmp_path).startswith("No record yet")
    runs = fake_runs()
    s = b.summarise(runs, 2.0, {"ring": 0.34, "aggregate": 0.26})
    record = {"results": {"model": "vgg16", "gpus": ["gpu1", "gpu2", "gpu3", "gpu4"], "switch": "as1",
                          "iterations": 3, "simulator": "calibrated", "runs": runs, "summary": s}}
    (tmp_path / "20261129T000000Z-abc1234-bench_aggregate.json").write_text(json.dumps(record))
    text = block.bench([], tmp_path)
    assert "| aggregate | 3 | 130 ms | 265 ms | 260 ms |" in text
    assert f"{s['all_reduce_speedup']:.2f}× / {s['iteration_speedup']:.2f}× (1.31×)" in text
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

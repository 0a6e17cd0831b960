"""The emulation's lags (simulator/model/lags.py) are what `python -m evidence.tracefit` measures on the committed
records
they were chosen on: a constant edited without its measurement, or a record changed, fails here."""
from __future__ import annotations

import json
import statistics

import pytest

from evidence import tracefit
from simulator.model import lags


@pytest.fixture(scope="module")
def figures():
    missing = [p for p in (*tracefit.REPLAYS, *tracefit.DEMO) if not p.exists()]
    if missing:
        pytest.fail(f"the records the lags were chosen on are missing: {', '.join(map(str, missing))}")
    records = [json.loads(p.read_text()) for p in tracefit.REPLAYS]
    demo = [x for p in tracefit.DEMO for x in tracefit.demo_jobs(json.loads(p.read_text()))]
    return tracefit.fit(tracefit.replay_runs(records), demo, records[0]["time_dilation"],
                        tracefit.ROOT / records[0]["rack_file"])


def test_each_constant_is_its_measurement(figures):
    med = statistics.median
    assert lags.CONTAINERS_PER_GPU_S == pytest.approx(figures[
        "containers per GPU (least squares within the replay's queue drains)"], abs=5e-4)
    assert lags.CONTAINERS_S == pytest.approx(med(figures["containers (GPUs free; less the per-GPU part)"]), abs=5e-4)
    assert lags.START_S == 0.0  # the start is work on the host's cores: no fixed part
    assert lags.START_PER_GPU_S == pytest.approx(figures[
        "start (the lags' model): per GPU placed at the instant, through the origin with the next"], abs=5e-4)
    assert lags.START_PER_BUSY_GPU_S == pytest.approx(figures[
        "start (the lags' model): per GPU of other jobs iterating at its admission"], abs=5e-4)
    assert lags.END_S == pytest.approx(med(figures["end (demo)"]), abs=5e-4)
    assert lags.RELEASE_S == pytest.approx(med(figures["release (that less the containers')"]), abs=5e-4)
    assert lags.ITERATION_S == pytest.approx(med(figures["iteration beyond compute (replay's 1-GPU jobs)"]), abs=5e-4)


def test_every_rank_starts_iterating_together(figures):
    """Why the lags start a job's ranks together: the demo's ranks' first iterations are milliseconds apart."""
    assert figures["ranks' first iterations apart (demo), at most"] < 0.05


def test_the_groups_and_bursts_are_counted_as_the_engine_counts_them():
    jobs = [{"start_s": s, "gpus_asked": g} for s, g in ((0.0, 2), (0.3, 4), (0.7, 1), (5.0, 3), (5.1, 1))]
    assert tracefit.bursts(jobs) == [2, 6, 7, 3, 4]
    assert [len(g) for g in tracefit.drains(jobs)] == [3, 2]
    a, b = tracefit.line([1.0, 2.0, 3.0], [3.0, 5.0, 7.0])
    assert (a, b) == pytest.approx((1.0, 2.0))


def test_repeatability_compares_two_replays_job_by_job_and_the_cli_needs_two(capsys):
    def record(ends):
        jobs = [{"index": i, "state": "done", "submit_s": 0.0, "end_s": e} for i, e in enumerate(ends)]
        return {"policies": {"fixed": {"jobs": jobs}}}

    r = tracefit.repeatability(record([10.0, 20.0, 40.0]), record([11.0, 20.0, 30.0]))["fixed"]
    assert r["jobs"] == 3 and r["median"] == pytest.approx(0.1)  # |differences| 10 %, 0 %, 25 %
    assert (r["makespan_a_s"], r["makespan_b_s"]) == (40.0, 30.0)
    assert tracefit.main(["--repeatability", "--replay", str(tracefit.REPLAYS[0])]) == 2
    assert "needs two or more" in capsys.readouterr().err


def test_makespans_per_policy_and_whether_one_prediction_can_be_within_5_percent_of_each(capsys, tmp_path):
    def record(*ends):
        jobs = [{"index": i, "state": "done", "submit_s": 0.0, "end_s": e} for i, e in enumerate(ends)]
        return {"policies": {"fixed": {"jobs": jobs}, "regroup": {"jobs": jobs}}, "time_dilation": 2.0,
                "rack_file": "topologies/trace16.yaml"}

    recs = [record(10.0, 100.0), record(20.0, 111.0)]
    recs[1]["policies"].pop("regroup")  # only the policies every record holds
    assert tracefit.makespans(recs) == {"fixed": [100.0, 111.0]}
    paths = []
    for i, ends in enumerate([(100.0,), (111.0,)]):  # 11 % apart: no value is within 5 % of both
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(record(*ends)))
    assert tracefit.main(["--repeatability", "--replay", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "fixed: makespans 100.0, 111.0 s over 2 replays; mean 105.5 s, the longest 11.0 % over the shortest; " \
           "a prediction within 5 % of every one does not exist" in out

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
        pytest.fail(f"the records the lags were fitted on are missing: {', '.join(map(str, missing))}")
    records = [json.loads(p.read_text()) for p in tracefit.REPLAYS]
    demo = [x for p in tracefit.DEMO for x in tracefit.demo_jobs(json.loads(p.read_text()))]
    figures = tracefit.fit(tracefit.host_runs(records), demo, records[0]["time_dilation"],
                           tracefit.ROOT / records[0]["rack_file"])
    return {**figures, "probes": tracefit.probes(records)}


def test_the_fit_set_is_every_probe_replay_of_the_two_fit_traces():
    """docs/trace-model.md's rule: trace16.csv and trace16-small.csv, each replay with the host's probe."""
    assert len(tracefit.REPLAYS) >= 4
    for path in tracefit.REPLAYS:
        record = json.loads(path.read_text())
        assert record["trace_file"].endswith(("trace16.csv", "trace16-small.csv")), path
        assert lags.host_factor(record) is not None, path


def test_each_constant_is_its_measurement(figures):
    med = statistics.median
    assert lags.PROBE_S == pytest.approx(med(figures["probes"]), abs=5e-4)
    fitted = {
        "CONTAINERS_S": "containers: a, least squares on the GPUs starting and those iterating at its admission",
        "CONTAINERS_PER_GPU_S": "containers: per GPU starting",
        "CONTAINERS_PER_BUSY_GPU_S": "containers: per GPU of other jobs iterating",
        "START_S": "start: a, least squares on the GPUs starting and those iterating at its admission",
        "START_PER_GPU_S": "start: per GPU starting",
        "START_PER_BUSY_GPU_S": "start: per GPU of other jobs iterating",
        "CONTAINERS_LOG_SD": "containers: log of measured over the least squares', standard deviation",
        "START_LOG_SD": "start: log of measured over the least squares', standard deviation",
        "LOG_CORRELATION": "the two logs' correlation",
        "END_S": "end (the line's intercept on the 1-GPU jobs' iterations x gradient GB)",
        "ITERATION_PER_GB_S": "iteration beyond compute, per GB of gradient (the line's slope)",
    }
    for name, figure in fitted.items():
        assert getattr(lags, name) == pytest.approx(figures[figure], abs=5e-4), name
    assert lags.RELEASE_S == pytest.approx(max(0.0, med(figures["release (that less the containers')"])), abs=5e-4)
    assert lags.ITERATION_S == 0.0  # the 1-GPU jobs' line has no part per iteration beyond the gradient's


def test_the_starting_gpus_are_counted_as_the_engine_counts_them():
    """A job's own GPUs and those of jobs admitted at or before it and not yet at their first iteration."""
    jobs = [{"admit_s": a, "first_iteration_s": f, "gpus_asked": g}
            for a, f, g in ((0.0, 3.0, 2), (1.0, 2.0, 4), (2.5, 4.0, 1), (5.0, 6.0, 3))]
    assert tracefit.starting(jobs) == [2, 6, 3, 3]


def test_every_rank_starts_iterating_together(figures):
    """Why the lags start a job's ranks together: the demo's ranks' first iterations are milliseconds apart."""
    assert figures["ranks' first iterations apart (demo), at most"] < 0.05


def test_a_replay_in_the_hosts_units_is_its_seconds_over_its_host_factor():
    """A run on a host twice as slow, every phase twice as long: the same figures as the run at factor 1."""
    def record(scale, probe):
        jobs = [{"index": i, "state": "done", "gpus_asked": g, "gpus": ["s1g1"] * g, "model": "resnet50",
                 "iterations": it, "submit_s": a, "admit_s": a, "start_s": a + scale * 0.2 * g,
                 "first_iteration_s": a + scale * (0.2 * g + 0.5 * g),
                 "end_s": a + scale * (0.2 * g + 0.5 * g + 0.3 + 0.01 * it) + 0.05 * it}
                for i, (a, g, it) in enumerate(((0.0, 1, 20), (30.0, 1, 40), (60.0, 2, 20), (90.0, 1, 60)))]
        return {"time_dilation": 1.0, "policies": {"fixed": {"jobs": jobs, "probe": [
            {"admit_s": 0.0, "first_iteration_s": probe}]}}}

    assert lags.host_factor(record(2.0, 2.0 * lags.PROBE_S)) == pytest.approx(2.0)
    (jobs, h), = tracefit.host_runs([record(2.0, 2.0 * lags.PROBE_S)])
    assert h == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no host's probe"):
        tracefit.host_runs([{"time_dilation": 1.0, "policies": {"fixed": {"jobs": []}}}])


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

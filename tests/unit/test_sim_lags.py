"""The emulation's lags in the engine (simulator/model/lags.py, Options.lags): where each is charged, that none changes
nothing, and that the trace check charges them (evidence/tracecheck.py)."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from controller.core.rack import load_rack
from evidence import tracecheck
from simulator.inputs.workloads import JobSpec
from simulator.model import lags
from simulator.model.engine import Options, Run, policies

ROOT = Path(__file__).resolve().parents[2]
TRACE16 = ROOT / "topologies" / "trace16.yaml"
LAGS = lags.Lags(containers_s=0.5, containers_per_gpu_s=0.1, start_s=2.0, start_per_gpu_s=0.25, end_s=0.3,
                 release_s=0.7, iteration_s=0.01)


def run(jobs, charged=lags.NONE):
    return Run(load_rack(TRACE16), jobs, policies(300.0)["fixed"], Options(step_model="exact", lags=charged)).run()


def test_none_charges_nothing_and_the_results_are_the_model_before():
    jobs = [JobSpec("a", 0.0, 4, "vgg16", 20), JobSpec("b", 0.5, 16, "resnet50", 10), JobSpec("c", 1.0, 1, "vgg16", 5)]
    plain = Run(load_rack(TRACE16), jobs, policies(300.0)["fixed"], Options(step_model="exact")).run()
    none = run(jobs)
    for p, n in zip(plain.jobs, none.jobs, strict=True):
        assert (p.placed_s, p.start_s, p.end_s, p.placement) == (n.placed_s, n.start_s, n.end_s, n.placement)
        assert n.started_s == n.placed_s  # without lags the containers start as the GPUs are granted
    b = none.jobs[1]
    assert b.placed_s == pytest.approx(none.jobs[0].end_s)  # the 16-GPU job waits for every GPU: no release lag


def test_each_lag_is_charged_where_it_belongs():
    alone = JobSpec("a", 1.0, 2, "vgg16", 10)
    base, lagged = run([alone]).jobs[0], run([alone], LAGS).jobs[0]
    assert lagged.placed_s == pytest.approx(1.0)  # GPUs granted at arrival
    assert lagged.started_s == pytest.approx(1.0 + 0.5 + 0.1 * 2)  # its two containers started
    assert lagged.start_s == pytest.approx(lagged.started_s + 2.0 + 0.25 * 2)  # then torch, the rendezvous
    # every iteration costs iteration_s more (its compute phase); the job's end comes end_s after its last iteration
    assert lagged.mean_iteration_s == pytest.approx(base.mean_iteration_s + 0.01, rel=1e-6)
    assert lagged.end_s - lagged.start_s == pytest.approx(10 * lagged.mean_iteration_s + 0.3, rel=1e-6)


def test_a_queued_job_is_placed_when_the_ended_jobs_gpus_are_released():
    big = JobSpec("big", 0.0, 16, "resnet50", 5)
    after = JobSpec("after", 0.1, 4, "vgg16", 5)
    out = run([big, after], LAGS)
    first, second = out.jobs
    assert second.placed_s == pytest.approx(first.end_s + 0.7)  # ended, then its containers removed
    assert second.started_s == pytest.approx(second.placed_s + 0.5 + 0.1 * 4)
    held = sorted(out.held)
    assert held[0] == pytest.approx((first.placed_s, first.end_s + 0.7, 16))  # held until released


def test_jobs_placed_at_one_instant_start_their_iterations_later_the_more_gpus_start_with_them():
    big = JobSpec("big", 0.0, 16, "resnet50", 5)
    two = [JobSpec("x", 0.1, 2, "vgg16", 5), JobSpec("y", 0.2, 4, "vgg16", 5)]
    _, x, y = run([big, *two], LAGS).jobs
    assert x.placed_s == y.placed_s  # one queue drain
    assert x.start_s - x.started_s == pytest.approx(2.0 + 0.25 * 2)
    assert y.start_s - y.started_s == pytest.approx(2.0 + 0.25 * (2 + 4))  # x's GPUs and its own
    alone = run([JobSpec("y", 0.0, 4, "vgg16", 5)], LAGS).jobs[0]
    assert alone.start_s - alone.started_s == pytest.approx(2.0 + 0.25 * 4)


def test_a_job_placed_while_others_iterate_starts_later_by_each_of_their_gpus():
    """The start is work on the host's cores: the GPUs of other jobs iterating as a job is placed slow it."""
    busy = lags.Lags(start_per_gpu_s=0.5, start_per_busy_gpu_s=0.2)
    first, second = run([JobSpec("a", 0.0, 4, "vgg16", 200), JobSpec("b", 5.0, 2, "vgg16", 5)], busy).jobs
    assert first.start_s - first.started_s == pytest.approx(0.5 * 4)  # nothing iterating at its placement
    assert first.start_s < second.placed_s < first.end_s  # a is iterating when b is placed
    assert second.start_s - second.started_s == pytest.approx(0.5 * 2 + 0.2 * 4)


def test_a_rack_slower_in_time_charges_the_emulated_lags_in_fewer_rack_seconds():
    one, two = lags.for_rack(1.0), lags.for_rack(2.0)
    assert one.start_s == lags.START_S and two.start_s == pytest.approx(lags.START_S / 2)
    assert two.containers(4) == pytest.approx((lags.CONTAINERS_S + 4 * lags.CONTAINERS_PER_GPU_S) / 2)
    assert two.release_s == pytest.approx(lags.RELEASE_S / 2) and two.end_s == pytest.approx(lags.END_S / 2)


def test_a_slower_host_charges_every_lag_that_many_times():
    base, slow = lags.for_rack(2.0), lags.for_rack(2.0, host=1.5)
    for field in ("containers_s", "containers_per_gpu_s", "start_s", "start_per_gpu_s", "start_per_busy_gpu_s",
                  "end_s", "release_s", "iteration_s"):
        assert getattr(slow, field) == pytest.approx(1.5 * getattr(base, field)), field


def test_the_host_factor_is_the_median_probe_over_the_fits():
    def run(*phases):  # each probe job: GPUs granted at 1.0 rack s, its first iteration `phase` later
        return {"probe": [{"admit_s": 1.0, "first_iteration_s": 1.0 + x} for x in phases]}

    d = 2.0
    record = {"time_dilation": d, "policies": {"fixed": run(1.0, 2.0), "regroup": run(2.0, 2.0),
                                               "defrag": run(3.0, 3.0)}}
    assert lags.probe_seconds(record["policies"]["fixed"], d) == pytest.approx(6.0)  # (1 + 2) x dilation
    assert lags.host_factor(record) == pytest.approx(8.0 / lags.PROBE_S)  # the median run: 8.0 emulated s
    assert lags.host_factor({"time_dilation": d, "policies": {"fixed": {"jobs": []}}}) is None
    assert lags.probe_seconds({"probe": [{"admit_s": None, "first_iteration_s": 2.0}]}, d) is None


def test_the_trace_check_charges_a_slower_hosts_lags_from_its_probe():
    trace = [{"arrival_s": 0.0, "gpus": 3, "model": "resnet50", "iterations": 20}]
    fast, _ = tracecheck.simulate(TRACE16, trace, "fixed", 300.0)
    slow, _ = tracecheck.simulate(TRACE16, trace, "fixed", 300.0, host=2.0)
    d = load_rack(TRACE16).spec.emulation.time_dilation
    drawn = statistics.fmean(draw[0][0] for draw in lags.draws(1))  # the first job's containers' factors' mean
    assert slow[0]["start_s"] == pytest.approx(2 * fast[0]["start_s"]) == pytest.approx(
        2 * drawn * lags.for_rack(d).containers(3))
    assert slow[0]["end_s"] > fast[0]["end_s"]


def test_the_trace_check_charges_the_lags_and_compares_the_containers_start():
    trace = [{"arrival_s": 0.0, "gpus": 3, "model": "resnet50", "iterations": 20},
             {"arrival_s": 0.5, "gpus": 16, "model": "vgg16", "iterations": 5}]
    rows, _ = tracecheck.simulate(TRACE16, trace, "fixed", 300.0)
    before, _ = tracecheck.simulate(TRACE16, trace, "fixed", 300.0, with_lags=False)
    charged = lags.for_rack(load_rack(TRACE16).spec.emulation.time_dilation)
    drawn = statistics.fmean(draw[0][0] for draw in lags.draws(len(trace)))  # the ensemble's mean factor
    assert before[0]["start_s"] == 0.0 and rows[0]["start_s"] == pytest.approx(drawn * charged.containers(3))
    assert rows[1]["start_s"] > before[1]["start_s"] + charged.release_s  # waited for the first job's release
    assert rows[1]["end_s"] > before[1]["end_s"]

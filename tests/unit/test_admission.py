"""Admission (controller/core/admission.py): first in, first out with head-of-line blocking, one definition that
the controller's placement and the simulator both call."""

from __future__ import annotations

from collections import deque

import pytest

from controller.core import admission
from controller.core.admission import Outcome
from controller.core.rack import load_rack
from simulator.inputs.workloads import JobSpec
from simulator.model.engine import Options, Run, policies
from tests.unit.jobfakes import FakeDriver
from tests.unit.test_jobs import make, req
from tests.unit.test_rack import PAPER


def test_fifo_stops_at_the_first_job_that_waits_and_removes_the_others():
    queue, tried = deque("abcde"), []
    outcome = {"a": Outcome.PLACED, "b": Outcome.REFUSED, "c": Outcome.WAIT, "d": Outcome.PLACED}

    def attempt(job):
        tried.append(job)
        return outcome[job]

    admission.fifo(queue, attempt)
    assert tried == ["a", "b", "c"]  # d would fit, but waits behind c: no overtaking
    assert list(queue) == ["c", "d", "e"]
    outcome["c"] = Outcome.PLACED
    outcome["e"] = Outcome.WAIT
    admission.fifo(queue, attempt)
    assert list(queue) == ["e"] and tried[3:] == ["c", "d", "e"]
    assert admission.POLICIES["fifo"] is admission.fifo


def _spy(monkeypatch) -> list[int]:
    calls = []
    real = admission.fifo

    def fifo(queue, attempt, cluster=None):
        calls.append(len(queue))
        return real(queue, attempt)

    monkeypatch.setattr(admission, "fifo", fifo)
    monkeypatch.setitem(admission.POLICIES, "fifo", fifo)
    return calls


def test_the_controller_drains_its_queue_through_the_core_policy(tmp_path, monkeypatch, vrt):
    calls = _spy(monkeypatch)
    ctx, placement, _ = make(tmp_path, FakeDriver(block=True), vrt)
    first = placement.submit(req(gpus=6))
    vrt.run(lambda: first.state == "running")
    waiting = placement.submit(req(gpus=2))
    placement.stop(first.id)
    vrt.run(lambda: waiting.state == "running", what="the queued job to start")
    assert 1 in calls  # the queue of one was drained by the core's policy
    placement.stop(waiting.id)


def test_the_simulator_drains_its_queue_through_the_same_policy(monkeypatch):
    calls = _spy(monkeypatch)
    rack = load_rack(PAPER)
    jobs = [JobSpec("a", 0.0, 6, "vgg16", 5), JobSpec("b", 0.0, 2, "vgg16", 5)]
    out = Run(rack, jobs, policies(300.0)["regroup"], Options()).run()
    assert calls and max(calls) >= 1
    a, b = out.jobs
    assert b.placed_s >= a.end_s  # b waited for a's GPUs, first in first out


# --- the controller's queue disciplines, on virtual time ------------------------------------------------------------
def _controller(tmp_path, vrt, queue: str, driver=None):
    from tests.unit.jobfakes import service
    from tests.unit.test_jobs import RACK

    driver = driver or FakeDriver(block=True)  # workers run until stopped
    jobs, _, _ = service(tmp_path, RACK, driver, vrt, queue=queue)
    vrt.advance(0)
    return jobs


def _running(jobs, vrt, **kw):
    job = jobs.submit(req(**kw))
    vrt.run(lambda: job.state == "running", what=f"{job.id} to run")
    return job


@pytest.mark.parametrize("queue, first", [("fifo", "long"), ("sjf", "short")])
def test_sjf_starts_the_shortest_queued_job_first_where_fifo_starts_the_first(tmp_path, vrt, queue, first):
    jobs = _controller(tmp_path, vrt, queue)
    _running(jobs, vrt, gpus=4, estimate_s=100.0)
    beside = _running(jobs, vrt, gpus=2, estimate_s=100.0)  # the rack's 6 GPUs are held
    queued = {"long": jobs.submit(req(gpus=2, estimate_s=50.0)), "short": jobs.submit(req(gpus=2, estimate_s=10.0))}
    assert all(j.state == "queued" for j in queued.values())
    jobs.stop(beside.id)  # two GPUs free up: room for one of them
    other = "short" if first == "long" else "long"
    vrt.run(lambda: queued[first].state == "running", what=f"the {first} job to start")
    assert queued[other].state == "queued" and queued[other].position == 1


@pytest.mark.parametrize("queue", ["fifo", "backfill"])
def test_backfill_starts_a_later_job_that_ends_before_the_first_ones_reservation(tmp_path, vrt, queue):
    jobs = _controller(tmp_path, vrt, queue)
    _running(jobs, vrt, gpus=4, estimate_s=100.0)  # its GPUs free up in 100 s, by its estimate
    head = jobs.submit(req(gpus=6, estimate_s=10.0))  # waits for the whole rack: reserved for then
    long = jobs.submit(req(gpus=2, estimate_s=500.0))  # fits the 2 free GPUs, but would delay the head
    short = jobs.submit(req(gpus=2, estimate_s=5.0))  # fits, and ends before the head's reservation
    vrt.advance(1.0)
    assert head.state == "queued" and long.state == "queued"
    if queue == "backfill":
        vrt.run(lambda: short.state == "running", what="the short job to backfill")
        assert (head.position, long.position) == (1, 2)
    else:  # first in, first out: nobody overtakes the head
        assert short.state == "queued" and short.position == 3


def test_backfill_judges_by_the_running_jobs_estimated_ends_as_time_passes(tmp_path, vrt):
    jobs = _controller(tmp_path, vrt, "backfill", FakeDriver(pace=1.0))  # workers print a line a second
    first = _running(jobs, vrt, gpus=4, estimate_s=100.0, workload={"iterations": 300})
    head = jobs.submit(req(gpus=6, estimate_s=10.0))  # reserved for when the first one's GPUs free up, by its estimate
    vrt.advance(first.admitted_at + 90.0 - vrt.clock())  # 10 s left: a 20-s job would now delay the head, a 5-s not
    late, fits = jobs.submit(req(gpus=2, estimate_s=20.0)), jobs.submit(req(gpus=2, estimate_s=5.0))
    assert (head.state, late.state) == ("queued", "queued") and fits.state != "queued"


@pytest.mark.parametrize("queue", ["fifo", "sjf"])
def test_sjf_starts_a_shorter_job_submitted_that_fits_and_a_longer_one_waits_behind_the_shortest(
        tmp_path, vrt, queue):
    jobs = _controller(tmp_path, vrt, queue)
    _running(jobs, vrt, gpus=4, estimate_s=100.0)  # 2 GPUs free
    waiting = jobs.submit(req(gpus=4, estimate_s=50.0))  # does not fit now
    shorter, longer = jobs.submit(req(gpus=2, estimate_s=10.0)), jobs.submit(req(gpus=2, estimate_s=80.0))
    assert waiting.state == "queued" and longer.state == "queued"  # behind the 50-s job, which blocks it
    assert (shorter.state == "queued") is (queue == "fifo")  # sjf: shorter than any that waits, and fits


@pytest.mark.parametrize("queue", ["backfill", "sjf"])
def test_queue_false_starts_a_job_the_discipline_starts_now_else_409_changing_nothing(tmp_path, vrt, queue):
    from controller.core.placement import NoRoomNow

    jobs = _controller(tmp_path, vrt, queue)
    _running(jobs, vrt, gpus=4, estimate_s=100.0)
    jobs.submit(req(gpus=6, estimate_s=50.0))  # waits for the whole rack
    before = (dict(jobs.book.jobs), list(jobs.book.queue))
    with pytest.raises(NoRoomNow, match=rf"1 queued job\(s\) ahead \({queue}\); not queued"):
        jobs.submit(req(gpus=2, estimate_s=500.0, queue=False))  # would delay the head (backfill), is longer (sjf)
    assert (dict(jobs.book.jobs), list(jobs.book.queue)) == before
    quick = jobs.submit(req(gpus=2, estimate_s=5.0, queue=False))  # ends before the head's reservation, is shortest
    assert quick.state != "queued" and list(jobs.book.queue) == before[1]


def test_a_job_without_an_estimate_is_refused_under_sjf_and_backfill_changing_nothing(tmp_path, vrt):
    from controller.core.placement import InvalidRequest

    for queue in ("sjf", "backfill"):
        jobs = _controller(tmp_path / queue, vrt, queue)
        with pytest.raises(InvalidRequest, match=f"required: this controller queues by {queue}") as e:
            jobs.submit(req(gpus=2))
        assert e.value.field == "estimate_s" and jobs.book.jobs == {}
    fifo = _controller(tmp_path / "fifo", vrt, "fifo")
    assert fifo.submit(req(gpus=2)).state in ("pending", "configuring", "running")  # fifo needs none


def test_the_controllers_disciplines_are_the_cores_and_las_is_not_one():
    from controller.config import OPTS
    from controller.jobs.admission import DISCIPLINES, Admission

    (opt,) = [o for o in OPTS if o.name == "queue"]
    assert opt.default == "fifo" and tuple(opt.type.choices) == DISCIPLINES
    assert set(DISCIPLINES) == set(admission.POLICIES) - {"las"}
    with pytest.raises(ValueError, match="queue discipline 'las' is not one of fifo, backfill, sjf"):
        Admission(None, None, None, None, "las")

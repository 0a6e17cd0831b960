"""Admission (controller/core/admission.py): first in, first out with head-of-line blocking, one definition that
the controller's placement and the simulator both call."""

from __future__ import annotations

from collections import deque

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

    def fifo(queue, attempt):
        calls.append(len(queue))
        return real(queue, attempt)

    monkeypatch.setattr(admission, "fifo", fifo)
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

"""The schedulers of controller/core/admission.py on hand-made traces whose right order is known: first on a fake
cluster that counts GPUs, then in the simulator, where they run beside the placement policies."""

from __future__ import annotations

from collections import deque

import pytest

from controller.core import admission
from controller.core.admission import Outcome, Running
from simulator.inputs.racks import RackOptions, generate
from simulator.inputs.workloads import JobSpec
from simulator.model.engine import Options, Run, policies, with_scheduler


class FakeCluster:
    """8 GPUs; a job runs for its length once placed; time moves only when the test says."""

    def __init__(self, total: int, lengths: dict[str, tuple[int, float]], served: dict[str, float] | None = None):
        self.total, self.lengths, self.now = total, lengths, 0.0
        self.held: dict[str, float] = {}  # job -> start
        self.served = served or {}
        self.started: list[tuple[str, float]] = []
        self.preempted: list[str] = []
        self.queue: deque[str] = deque()

    def free(self) -> int:
        return self.total - sum(self.lengths[j][0] for j in self.held)

    def gpus(self, job) -> int:
        return self.lengths[job][0]

    def estimate(self, job) -> float:
        return self.lengths[job][1] - (self.now - self.held[job] if job in self.held else 0.0)

    def attained(self, job) -> float:
        return self.served.get(job, 0.0) + ((self.now - self.held[job]) * self.gpus(job) if job in self.held else 0)

    def running(self) -> list[Running]:
        return [Running(j, self.gpus(j), s + self.lengths[j][1], self.attained(j)) for j, s in self.held.items()]

    def preempt(self, job) -> None:
        self.served[job] = self.attained(job)
        del self.held[job]
        self.preempted.append(job)
        self.queue.append(job)

    def attempt(self, job) -> Outcome:
        if self.gpus(job) > self.free():
            return Outcome.WAIT
        self.held[job] = self.now
        self.started.append((job, self.now))
        return Outcome.PLACED

    def drain(self, policy) -> None:
        policy(self.queue, self.attempt, self)

    def end(self, job) -> None:
        self.now = self.held[job] + self.lengths[job][1]
        del self.held[job]


def test_backfill_lets_a_short_small_job_pass_a_blocked_large_one_without_delaying_it():
    # r holds 6 of 8 GPUs until t = 100; a needs all 8; b (2 GPUs) would still run at 100; c (2 GPUs) ends at 50
    for name in ("fifo", "backfill"):
        c = FakeCluster(8, {"r": (6, 100.0), "a": (8, 10.0), "b": (2, 500.0), "c": (2, 50.0)})
        c.queue.append("r")
        c.drain(admission.POLICIES[name])
        c.queue.extend("abc")
        c.drain(admission.POLICIES[name])
        if name == "fifo":
            assert c.started == [("r", 0.0)] and list(c.queue) == ["a", "b", "c"]  # c waits behind a
            continue
        assert c.started == [("r", 0.0), ("c", 0.0)]  # c passes a; b would delay a, so it waits
        assert list(c.queue) == ["a", "b"]
        c.end("c")
        c.drain(admission.POLICIES[name])
        assert c.started[-1] == ("c", 0.0)  # b still may not start (it would hold 2 GPUs past 100)
        c.end("r")
        c.drain(admission.POLICIES[name])
        assert c.started[2] == ("a", 100.0)  # a starts at its shadow time: not delayed


def test_backfill_uses_the_gpus_the_blocked_job_will_not_need():
    # a needs 4; at r's end (100) 8 are free, 4 spare: b (2 GPUs, long) may run past 100
    c = FakeCluster(8, {"r": (6, 100.0), "a": (4, 10.0), "b": (2, 500.0), "d": (2, 500.0)})
    c.queue.append("r")
    c.drain(admission.backfill)
    c.queue.extend("abd")
    c.drain(admission.backfill)
    assert [j for j, _ in c.started] == ["r", "b"] and list(c.queue) == ["a", "d"]
    c.end("r")
    c.drain(admission.backfill)
    assert c.started[2] == ("a", 100.0) and c.started[3] == ("d", 100.0)


def test_shortest_job_first_takes_the_queue_by_estimated_length():
    c = FakeCluster(8, {"r": (8, 100.0), "a": (8, 1000.0), "b": (8, 10.0), "c": (8, 100.0)})
    c.queue.append("r")
    c.drain(admission.sjf)
    c.queue.extend("abc")
    c.drain(admission.sjf)
    assert list(c.queue) == ["a", "b", "c"]
    for job in ("r", "b", "c"):
        c.end(job)
        c.drain(admission.sjf)
    assert [j for j, _ in c.started] == ["r", "b", "c", "a"]  # fifo would run a first


def test_least_attained_service_preempts_a_job_of_a_worse_level():
    c = FakeCluster(8, {"r": (8, 1e6), "n": (4, 10.0)})
    c.queue.append("r")
    c.drain(admission.las)
    c.now = 100.0  # r attained 800 GPU-seconds: level 0, as n: no preemption
    c.queue.append("n")
    c.drain(admission.las)
    assert c.preempted == [] and list(c.queue) == ["n"]
    c.now = 1000.0  # r attained 8,000 GPU-seconds: past the first threshold, level 1
    assert admission.level(c.attained("r")) == 1 and admission.level(0) == 0
    c.drain(admission.las)
    assert c.preempted == ["r"] and c.started[-1] == ("n", 1000.0) and list(c.queue) == ["r"]
    c.end("n")
    c.drain(admission.las)
    assert c.started[-1] == ("r", 1010.0) and c.served["r"] == pytest.approx(8000.0)


# --- in the simulator -------------------------------------------------------------------------------------------

RACK = RackOptions(8, gpus_per_switch=8, gpus_per_server=4, oversubscription=1, models=(("V100", 1.0),), spare=1.0)


def simulate(jobs: list[JobSpec], scheduler: str, placement: str = "fixed"):
    policy = with_scheduler(policies(300.0)[placement], scheduler)
    out = Run(generate(RACK), jobs, policy, Options()).run()
    return {j.id: j for j in out.jobs}, out


@pytest.mark.parametrize("placement", ["fixed", "regroup"])
def test_backfill_in_the_simulator_passes_a_blocked_job_without_delaying_it(placement):
    jobs = [
        JobSpec("long", 0.0, 6, "resnet50", 2000),
        JobSpec("big", 1.0, 8, "resnet50", 50),
        JobSpec("short", 2.0, 2, "resnet50", 20),  # ends long before "long" does
        JobSpec("late", 3.0, 2, "resnet50", 50_000),  # would hold 2 GPUs past "long"'s end
    ]
    fifo, _ = simulate(jobs, "fifo", placement)
    easy, run = simulate(jobs, "backfill", placement)
    assert run.policy.name == f"{placement}+backfill"
    assert fifo["short"].placed_s >= fifo["big"].placed_s  # head-of-line blocking
    assert easy["short"].placed_s == pytest.approx(2.0)  # backfilled at once
    assert easy["late"].placed_s >= easy["big"].placed_s  # it would have delayed big
    assert easy["big"].placed_s == pytest.approx(fifo["big"].placed_s)  # not delayed
    assert easy["big"].placed_s == pytest.approx(easy["long"].end_s)
    assert easy["short"].jct_s < fifo["short"].jct_s


def test_sjf_in_the_simulator_runs_the_shorter_waiting_job_first():
    jobs = [
        JobSpec("first", 0.0, 8, "resnet50", 200),
        JobSpec("long", 1.0, 8, "resnet50", 2000),
        JobSpec("short", 2.0, 8, "resnet50", 100),
    ]
    fifo, _ = simulate(jobs, "fifo")
    sjf, _ = simulate(jobs, "sjf")
    assert fifo["long"].placed_s < fifo["short"].placed_s
    assert sjf["short"].placed_s == pytest.approx(sjf["first"].end_s) and sjf["long"].placed_s == sjf["short"].end_s


def test_las_in_the_simulator_preempts_and_the_preempted_job_finishes_every_iteration():
    jobs = [
        JobSpec("hog", 0.0, 8, "resnet50", 100_000),
        JobSpec("small", 2000.0, 4, "resnet50", 100),  # by then hog attained far more than 3,600 GPU-seconds
    ]
    fifo, _ = simulate(jobs, "fifo")
    las, run = simulate(jobs, "las")
    assert fifo["small"].placed_s == pytest.approx(fifo["hog"].end_s) and fifo["hog"].preemptions == 0
    hog, small = las["hog"], las["small"]
    assert small.placed_s == pytest.approx(2000.0) and hog.preemptions == 1
    assert hog.suspended_s == pytest.approx(small.end_s - 2000.0, rel=0.05)
    assert hog.done == 100_000 and hog.end_s > fifo["hog"].end_s
    assert small.jct_s < fifo["small"].jct_s / 10
    held = sum((b - a) * n for a, b, n in run.held)
    assert held < (hog.end_s - 0.0) * 8 + small.jct_s * 4  # the preempted job held nothing while suspended


def test_an_unknown_scheduler_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown scheduler 'lottery'"):
        with_scheduler(policies(300.0)["fixed"], "lottery")

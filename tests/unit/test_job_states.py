"""A job's states as one table (controller/core/jobs.py TRANSITIONS): every state change goes through `transition`,
an illegal one raises and changes nothing, and the job's life in the job service (built alone, with fakes for its
ports) makes exactly the table's transitions, no more and no fewer."""

from __future__ import annotations

import pytest

from controller.core import jobs as core
from controller.core import placement as policy
from controller.core.jobs import NEW, TRANSITIONS, IllegalTransition, Job, transition
from tests.unit.jobfakes import FakeDriver
from tests.unit.test_jobs import finished, make, req
from tests.unit.virtual import VirtualRuntime

STATES = set(TRANSITIONS)
EDGES = {(a, b) for a, tos in TRANSITIONS.items() for b in tos}


def test_the_table_covers_every_state_and_ends_only_in_terminal_ones():
    assert STATES == {NEW, core.QUEUED, *core.ACTIVE, *core.TERMINAL}
    assert all(b in STATES for _, b in EDGES)
    assert {s for s, tos in TRANSITIONS.items() if not tos} == {"done", "failed"}
    assert not any(b == NEW for _, b in EDGES)  # nothing goes back to being submitted


@pytest.mark.parametrize(("a", "b"), sorted((a, b) for a in STATES for b in STATES if (a, b) not in EDGES))
def test_an_illegal_transition_raises_and_changes_nothing(a, b):
    job = Job(id="job-7", request={}, state=a, reason="before")
    with pytest.raises(IllegalTransition, match=f"job-7: {a} -> {b} is not a job transition"):
        transition(job, b, reason="after")
    assert job.state == a and job.reason == "before"


def test_a_transition_sets_its_fields_with_the_state_and_refuses_unknown_ones():
    job = Job(id="job-1", request={})
    assert job.state == NEW
    transition(job, "pending", gpus=["gpu1"], note="n")
    assert (job.state, job.gpus, job.note) == ("pending", ["gpu1"], "n")
    with pytest.raises(AttributeError, match="no field 'colour'"):
        transition(job, "configuring", colour="red")
    assert job.state == "pending"


@pytest.fixture
def seen():
    """Every state change of a job, (from, to), as the test sees it happen: through Job's attribute setting, so
    that a change made without transition() is seen too (the product keeps no hook for tests)."""
    made: list[tuple[str, str]] = []
    setattr_ = core.Job.__setattr__

    def recording(job, name, value):
        if name == "state" and "state" in job.__dict__:
            made.append((job.__dict__["state"], value))
        setattr_(job, name, value)

    with pytest.MonkeyPatch.context() as patch:  # its own: the test undoes its monkeypatch midway
        patch.setattr(core.Job, "__setattr__", recording)
        yield made


def test_the_lifecycle_makes_exactly_the_tables_transitions(tmp_path, seen, monkeypatch, vrt):
    # new -> pending -> configuring -> running -> done
    ctx, placement, _ = make(tmp_path / "a", FakeDriver(), vrt)
    job = placement.submit(req(gpus=["gpu1", "gpu2"], policy="regroup"))
    vrt.run(finished(placement, job.id))
    assert job.state == "done", job.reason

    # new -> queued -> pending (drained when the first job ends); queued -> stopped; running -> stopped -> stopped
    ctx, placement, _ = make(tmp_path / "b", FakeDriver(block=True), vrt)
    first = placement.submit(req(gpus=6))
    vrt.run(lambda: first.state == "running")
    waiting, dropped = placement.submit(req(gpus=2)), placement.submit(req(gpus=2))
    assert (waiting.state, dropped.state) == ("queued", "queued")
    placement.stop(dropped.id)
    placement.stop(first.id)
    vrt.run(lambda: waiting.state == "running", what="the queued job to start")
    placement.stop(waiting.id)
    assert (first.state, dropped.state, waiting.state) == ("stopped", "stopped", "stopped")

    # configuring -> failed (a container does not start); running -> failed (a worker exits with an error)
    ctx, placement, _ = make(tmp_path / "c", FakeDriver(fail_start_on="gpu2"), vrt)
    bad = placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    vrt.run(finished(placement, bad.id))
    ctx, placement, _ = make(tmp_path / "d", FakeDriver(exit_codes={"gpu2": 3}), vrt)
    crash = placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    vrt.run(finished(placement, crash.id))
    assert (bad.state, crash.state) == ("failed", "failed")

    # pending -> configuring after a restart: the controller died between a job's admission and its placement (its
    # record says pending); the new one places it
    ctx, placement, _ = make(tmp_path / "e", FakeDriver(block=True), vrt)
    held = placement.submit(req(gpus=2))
    vrt.run(lambda: held.state == "running")
    ctx.save(jobs=[{**held.to_state(), "state": "pending", "circuits": []}])  # what the store holds, not the job
    rt2 = VirtualRuntime()  # a restart
    _, placement2, _ = make(tmp_path / "e", FakeDriver(block=True), rt2)
    again = placement2.get(held.id)
    rt2.run(lambda: again.state == "running", what="the pending job placed after the restart")
    placement2.stop(again.id)

    # queued -> failed: the rack changed so that the queued job can never run
    ctx, placement, _ = make(tmp_path / "f", FakeDriver(block=True), vrt)
    first = placement.submit(req(gpus=6))
    vrt.run(lambda: first.state == "running")
    doomed = placement.submit(req(gpus=2))
    assert doomed.state == "queued"

    def never(*a, **k):
        raise policy.PlacementError("gpus: no GPU of model Z80 in this rack")

    monkeypatch.setattr(policy, "plan", never)
    placement.stop(first.id)
    assert doomed.state == "failed" and "Z80" in doomed.reason

    # running -> recovering -> running (a server dies, a spare is swapped in); recovering -> failed (the spare's
    # container does not start); recovering -> stopped (stopped while it waits for a spare)
    monkeypatch.undo()
    driver = FakeDriver(pace=1.0, fail_start_on="gpu6")
    ctx, placement, _ = make(tmp_path / "g", driver, vrt)
    swapped = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], workload={"iterations": 30}))
    vrt.run(lambda: len(swapped.iterations()) >= 3)
    driver.kill_server("srv2")  # gpu5 is the spare
    vrt.run(lambda: swapped.recoveries and swapped.state == "running")
    driver.kill_server("srv4")  # gpu6 is the next one, and it does not start
    vrt.run(finished(placement, swapped.id))
    assert swapped.state == "failed" and "recovering failed: cannot start the container of gpu6" in swapped.reason
    driver = FakeDriver(pace=1.0)
    ctx, placement, _ = make(tmp_path / "h", driver, vrt)
    waits = placement.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"], workload={"iterations": 30}))
    holds = placement.submit(req(gpus=["gpu5", "gpu6"], workload={"iterations": 100}))
    vrt.run(lambda: len(waits.iterations()) >= 2)
    driver.kill_server("srv4")
    vrt.run(lambda: "waiting" in waits.note)
    placement.stop(waits.id)
    placement.stop(holds.id)
    assert waits.state == "stopped"

    extra, never = set(seen) - EDGES, EDGES - set(seen)
    assert not extra and not never, f"exercised but not in the table: {extra}; never exercised: {never}"


def test_each_job_record_describes_the_placement_it_holds(tmp_path, vrt):
    """Jobs submitted together are admitted from one picture of the rack and placed one after the other, each
    planned again from the circuits as they are then: each record's note, switches, GPUs and circuits must
    describe the placement that stood."""
    ctx, placement, ocs = make(tmp_path, FakeDriver(block=True), vrt)
    jobs = [placement.submit(req(gpus=n, policy="regroup")) for n in (2, 2, 2)]
    vrt.run(lambda: all(j.state == "running" for j in jobs), what="the three jobs to run")
    where = ctx.circuits.gpu_locations(ctx.rack)
    for job in jobs:
        switches = sorted({where[g][0] for g in job.gpus})
        assert sorted(job.switches) == switches, job.id
        if len(switches) == 1:
            assert f"under {switches[0]} (" in job.note, (job.id, job.note, switches)
        else:
            assert f"spread over {len(switches)}: {', '.join(job.switches)}" in job.note, (job.id, job.note)
        circuits = {frozenset(map(str, c)) for c in ctx.circuits.circuits}
        assert {frozenset(c) for c in job.circuits} <= circuits
        assert {c[0] for c in job.circuits} == {str(ctx.rack.gpu_port(g)) for g in job.gpus}
    for job in jobs:
        placement.stop(job.id)


def test_the_note_is_restated_for_the_plan_that_stood():
    why = "2 x M40: one model (0.2 s); "
    admitted = policy.Plan(("gpu1", "gpu2"), ("s1",), (), (), why + "under s1 (0 circuit changes)")
    applied = policy.Plan(("gpu1", "gpu2"), ("s2",), (), (), "under one switch (0 circuit changes)")
    assert policy.restated(admitted, applied) == "2 x M40: one model (0.2 s); under s2 (0 circuit changes)"
    named = policy.Plan(("gpu1",), ("s1",), (), (), "under one switch (0 circuit changes)")
    assert policy.restated(named, applied) == applied.note

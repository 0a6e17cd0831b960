"""The job service's loop stepped one event at a time on virtual time (no loop thread: the test takes each event), and
the rule that binds its parts: each is built from ports, the book, the inbox and the runtime (and plain settings),
never from another part or a callable of one, read from their constructors' annotations."""
from __future__ import annotations

import inspect
import typing

import pytest

from controller.jobs import (
    actions,
    admission,
    book,
    detect,
    external,
    inbox,
    loop,
    ports,
    records,
    recovery,
    regroup,
    restart,
    runs,
    runtime,
    warm,
    workers,
)
from controller.jobs.inbox import Call, Done, Lost, Reconcile, Reply
from controller.jobs.service import JobService
from tests.unit.jobfakes import FakeDriver, service
from tests.unit.test_jobs import RACK, req


def _next(jobs, rt, kinds=None):
    """Let the threads (actions, followers) run until an event is in the inbox, and take that one event."""
    rt.run(lambda: len(jobs.inbox) > 0, what="an event")
    ev = jobs.loop.step()
    assert kinds is None or isinstance(ev, kinds), ev
    return ev


def test_the_loop_takes_one_event_at_a_time_and_a_loss_mid_step_remakes_the_plan(tmp_path, vrt):
    driver = FakeDriver(pace=1.0)
    jobs, _, _ = service(tmp_path, RACK, driver, vrt, start=False)
    reply = Reply(vrt)
    jobs.inbox.post(Call("admission.submit", (req(gpus=["gpu1", "gpu2", "gpu3"], workload={"iterations": 30},
                                                 checkpoint_every=5), {}), reply))
    assert isinstance(jobs.loop.step(), Call) and reply.answered
    job = reply.value
    assert job.state == "pending"  # admitted, its GPUs reserved; placed on the next event
    assert isinstance(jobs.loop.step(), Reconcile) and job.state == "configuring"
    assert jobs.book.inflight[job.id][0] == "runs.placed"  # its circuit change runs as an action
    assert jobs.loop.step() is None  # nothing else to take until the action ends
    assert _next(jobs, vrt, Done).step == "runs.placed" and jobs.book.inflight[job.id][0] == "runs.started"
    assert _next(jobs, vrt, Done).step == "runs.started" and job.state == "running"
    while len(job.iterations()) < 12:
        _next(jobs, vrt)
    driver.kill_server("srv2")
    while job.state == "running":
        _next(jobs, vrt)  # the follower's end of gpu2, then its Lost
    assert job.recovery["step"] == "detected"
    _next(jobs, vrt, Reconcile)
    assert job.recovery["step"] == "assessed" and jobs.book.inflight[job.id][0] == "recovery.swapped"
    spare = job.recovery["spares"]["gpu2"]
    jobs.inbox.post(Lost(job.id, "gpu1", "the link of gpu1's NIC went down", sure=True))  # while the swap runs
    _next(jobs, vrt, Lost)
    assert job.recovery["step"] == "assessed" and "gpu1" in job.recovery["signs"]  # noted; the swap goes on
    _next(jobs, vrt, Done)  # the swap's outcome: the loss found now joins the recovery and the plan is made again
    assert job.recovery["replans"] == 1 and set(job.recovery["losing"]) == {"gpu1"}, job.recovery
    assert spare in job.gpus and jobs.book.inflight[job.id][0] == "recovery.swapped"  # gpu1's own swap now
    while job.state != "done":
        _next(jobs, vrt)
    (rec,) = job.recoveries
    assert set(rec["lost"]) == {"gpu1", "gpu2"} and rec["replans"] == 1
    assert [i["iteration"] for i in job.iterations()] == list(range(30))


PARTS = [admission.Admission, runs.Runs, recovery.Recovery, detect.Detector, warm.Warm, regroup.Regroup,
         external.External, restart.Restart, records.Records, workers.Workers, actions.Actions]
ALLOWED = {book.JobBook, inbox.Inbox, runtime.Runtime, ports.CircuitChangesPort, ports.ContainersPort,
           ports.SchedulerPort, ports.EnginesPort, ports.AggregatorsPort, bool, int, float, str, type(None)}


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.__name__)
def test_a_part_is_built_from_ports_the_book_the_inbox_the_runtime_and_settings_only(part):
    hints = typing.get_type_hints(part.__init__)
    params = [p for p in inspect.signature(part.__init__).parameters if p != "self"]
    assert params and all(p in hints for p in params), f"{part.__name__}: every parameter annotated"
    for p in params:
        kinds = typing.get_args(hints[p]) or (hints[p],)
        wrong = [k for k in kinds if k not in ALLOWED]
        assert not wrong, f"{part.__name__}({p}: {hints[p]}): not a port, the book, the inbox, the runtime or a setting"


def test_the_annotation_check_can_fail():
    class Bad:
        def __init__(self, other: runs.Runs, then: typing.Callable[[], None]):
            pass

    hints = typing.get_type_hints(Bad.__init__)
    assert hints["other"] not in ALLOWED and hints["then"] not in ALLOWED


def test_the_service_wires_no_lambda_and_every_event_kind_has_a_step():
    assert "lambda" not in inspect.getsource(JobService)
    jobs = JobService.__new__(JobService)
    names = set(JobService.__init__.__code__.co_names)
    assert {"WorkerLine", "WorkerEnded", "EngineChanged", "LinkChanged", "Tick", "Lost", "End", "Drain"} <= names
    assert jobs is not None and loop.Loop.step.__doc__

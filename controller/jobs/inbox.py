"""The job service's one inbox, and the events posted to it.

Threads that follow workers, ping engines, watch links, run actions (I/O a step started: a circuit change, containers
started), tick the clock and serve REST only post events here; one loop (loop.py) takes them one at a time. An API call
(submit, stop, regroup, ...) is a `Call` with a `Reply` the caller waits on: the loop answers it once it has decided
(at once, or when the action it started has finished)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from controller.jobs.runtime import Runtime


class Reply:
    """The answer to a Call: a value, or an error raised in the caller's thread."""

    def __init__(self, rt: Runtime):
        self._done = rt.event()
        self.value: Any = None
        self.error: BaseException | None = None

    def set(self, value: Any = None) -> None:
        self.value = value
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._done.set()

    @property
    def answered(self) -> bool:
        return self._done.is_set()

    def wait(self) -> Any:
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.value


@dataclass
class Call:
    """An API call: the part's method `what` with `args`, answered through `reply`."""

    what: str
    args: tuple = ()
    reply: Reply | None = None


@dataclass
class WorkerLine:
    """A JSON line a worker printed (an iteration, a checkpoint, a heartbeat, an error), as its follower read it."""

    job: str
    gpu: str
    fid: int  # its follower (the loop takes only the current follower's word for a rank)
    line: dict
    at: float  # when it was read (the controller's clock)


@dataclass
class WorkerEnded:
    """A worker's stream ended: it exited with `code`, or (code None) it vanished, its stream broken (`why`)."""

    job: str
    gpu: str
    fid: int
    code: int | None
    why: str


@dataclass
class EngineChanged:
    """A server's engine stopped answering (`up` False, with why), or is usable again (swept after it came back)."""

    server: str
    up: bool
    why: str = ""


@dataclass
class LinkChanged:
    """The OCS reported the link of one of its ports (a GPU's NIC) up or down."""

    port: str
    up: bool


@dataclass
class Tick:
    """The clock moved on: time-based decisions (a settle window ended, a rank went silent, a wait to retry)."""


@dataclass
class Reconcile:
    """Bring this job to where it should be from its record and the world as observed now (posted for every active
    job at a restart, and by a step that wants its job looked at again)."""

    job: str


@dataclass
class Done:
    """An action a step started has finished: its result, or the error it raised. `step` names the step that takes
    it next (a method of the part that started it); `token` tells a stale action's result from the current one's."""

    job: str
    step: str
    token: int
    result: Any = None
    error: BaseException | None = None


@dataclass
class Lost:
    """A sign that a rank of a running (or recovering) job is lost or has failed: the recovery takes it."""

    job: str
    gpu: str
    why: str
    sure: bool  # its GPU is lost (its server down or hung, its link down, its worker killed or vanished)
    killed: bool = False  # its worker died by a signal, or hung, on a server that answers: it may take its rank again


@dataclass
class End:
    """End this job: done, failed (with the reason) or stopped, everything it holds given back; `undo`: the circuits
    its placement changed (a CircuitDiff), put back first."""

    job: str
    state: str
    reason: str | None = None
    undo: Any = None
    reply: Reply | None = None  # answered with the job once it has ended


@dataclass
class Drain:
    """GPUs may have been freed: start queued jobs that fit, and retry recoveries waiting for spares."""


Event = Call | WorkerLine | WorkerEnded | EngineChanged | LinkChanged | Tick | Reconcile | Done | Lost | End | Drain


@dataclass
class Inbox:
    """Events in the order they were posted; `get` waits for one."""

    rt: Runtime
    _events: collections.deque = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        self._ready = self.rt.event()

    def post(self, event: Event) -> None:
        self._events.append(event)
        self._ready.set()

    def get(self, timeout: float | None = None) -> Event | None:
        """The next event; None if none came within `timeout` s (0: do not wait)."""
        if not self._events and timeout != 0:
            self._ready.wait(timeout)
        if not self._events:
            return None
        event = self._events.popleft()
        if not self._events:
            self._ready.clear()
        return event

    def __len__(self) -> int:
        return len(self._events)

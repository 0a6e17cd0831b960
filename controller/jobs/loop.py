"""The loop: the one thread that changes the job book. It takes the inbox's events one at a time and hands each to the
steps that take it (service.py wires them): a worker's line or end, an engine or link that changed, a tick, an API
call, an action's outcome, a sign of a loss, a job to end, GPUs freed, and `Reconcile(job)`, which the step owning the
job's state takes (every active job's, at a restart). `step()` takes one event, so a test on virtual time can step the
loop one event at a time; `run()` takes them forever. A step that raises is a bug: logged with its event, and the loop
goes on (a call's caller gets the error)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.jobs.book import JobBook
from controller.jobs.inbox import Call, Done, End, Event, Inbox, Reconcile
from controller.jobs.steps import LOG, _reason

Step = Callable[..., Any]


class Loop:
    def __init__(self, inbox: Inbox, book: JobBook, handlers: dict[type, list[Step]], steps: dict[str, object],
                 reconcilers: dict[tuple[str, str], list[Step]]):
        self.inbox, self.book = inbox, book
        self.handlers = handlers  # event type -> the steps that take it, in order
        self.steps = steps  # part name -> the part whose methods a Call or a Done names ("runs.started")
        self.reconcilers = reconcilers  # (job kind, job state) -> the steps that reconcile such a job
        self.taken = 0  # events taken so far

    def run(self) -> None:
        while True:
            self.step(timeout=None)

    def step(self, timeout: float | None = 0) -> Event | None:
        """Take one event (waiting up to `timeout` s for one; None: as long as it takes) and hand it on; the event, or
        None if none came."""
        event = self.inbox.get(timeout)
        if event is None:
            return None
        self.taken += 1
        try:
            self.handle(event)
        except Exception as e:  # noqa: BLE001 (a bug in a step must not stop the loop)
            LOG.exception("the job service's loop: %s failed", type(event).__name__)
            if isinstance(event, Call) and event.reply is not None and not event.reply.answered:
                event.reply.fail(e)
            job = self.book.jobs.get(getattr(event, "job", None) or "")
            if job is not None and job.active and not isinstance(event, End):
                self.inbox.post(End(job.id, "failed", _reason(e)))  # never left running because of a bug
        return event

    def _method(self, name: str) -> Step:
        part, _, method = name.partition(".")
        return getattr(self.steps[part], method)

    def handle(self, event: Event) -> None:
        if isinstance(event, Call):
            try:
                self._method(event.what)(event.reply, *event.args)
            except Exception as e:
                if event.reply is None or event.reply.answered:
                    raise
                event.reply.fail(e)  # the API's answer: an expected refusal (404, 409, ...) or a bug (500)
            return
        if isinstance(event, Done):
            if event.token:
                if self.book.inflight.get(event.job) != (event.step, event.token):
                    LOG.debug("%s: a stale %s outcome, passed over", event.job, event.step)
                    return
                del self.book.inflight[event.job]
                if event.job in self.book.deferred:  # the job was ended meanwhile: its end now, not the next step
                    self.inbox.post(self.book.deferred.pop(event.job))
                    return
            self._method(event.step)(event)
            return
        if isinstance(event, Reconcile):
            job = self.book.jobs.get(event.job)
            if job is not None:
                for reconcile in self.reconcilers.get((job.kind, job.state), []):
                    reconcile(job)
            return
        for take in self.handlers.get(type(event), []):
            take(event)

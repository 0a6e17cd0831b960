"""Actions: the I/O a step starts (a circuit change, containers started, workers told to regroup, a server swept) runs
in a thread of its own, so that the loop goes on taking events meanwhile, and its outcome comes back through the
inbox as a `Done` naming the step that takes it next. A job has at most one tracked action in flight (the book's
`inflight`, with a token): the loop hands a Done to its step only if it is that job's current action, so the result of
an action that a later decision made stale (the job ended meanwhile) changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.jobs.book import JobBook
from controller.jobs.inbox import Done, Inbox
from controller.jobs.runtime import Runtime


class Actions:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime):
        self.book, self.inbox, self.rt = book, inbox, rt

    def start(self, job: str, then: str, fn: Callable[..., Any], *args: Any, tracked: bool = True) -> int:
        """Run `fn(*args)` in a thread; post Done(job, then, token, result or error) when it ends. `tracked`: the
        job's one action in flight (a step waits for it before the next); untracked ones (a warm spare, a sweep, a
        probe) run beside it."""
        token = next(self.book.tokens) if tracked else 0
        if tracked:
            self.book.inflight[job] = (then, token)

        def run() -> None:
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 (handed to the step, which decides)
                self.inbox.post(Done(job, then, token, None, e))
                return
            self.inbox.post(Done(job, then, token, result))

        self.rt.spawn(run)
        return token

    def busy(self, job: str) -> bool:
        """Whether the job has a tracked action in flight."""
        return job in self.book.inflight

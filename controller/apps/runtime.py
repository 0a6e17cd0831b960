"""The eventlet runtime (Ryu's hub) behind controller/jobs/runtime.py's interface: the one module of the controller
that calls the hub. Every app, driver and the job service get their threads, sleeps, locks and events from it (as
`ctx.rt`), so that a test can hand in a runtime whose clock it drives."""

from __future__ import annotations

from ryu.lib import hub


class HubRuntime:
    def spawn(self, fn, *args, raise_error: bool = False):
        return hub.spawn(fn, *args, raise_error=raise_error)

    def joinall(self, threads) -> None:
        hub.joinall(list(threads))

    def sleep(self, seconds: float) -> None:
        hub.sleep(seconds)

    def lock(self):
        return hub.BoundedSemaphore(1)

    def event(self):
        return hub.Event()


HUB = HubRuntime()

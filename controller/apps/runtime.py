"""The eventlet runtime (Ryu's hub) behind controller/jobs/runtime.py's interface: the one place the job service's
threads, sleeps and locks meet eventlet."""

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
        return hub.Semaphore(1)

"""The job service's errors, which the REST API maps to statuses (controller/apps/http.py)."""

from __future__ import annotations

from controller.core.events import ReconfigEvent


class Conflict(RuntimeError):
    """The request conflicts with the state of the rack (a running job, another request)."""


class Busy(Conflict):
    """Another reconfiguration holds the rack."""


class UnknownJob(KeyError):
    """No job of that id."""


class ReconfigFailed(RuntimeError):
    """A reconfiguration the devices refused or did not confirm (rolled back); `event` says how far it got."""

    def __init__(self, event: ReconfigEvent):
        self.event = event
        super().__init__(event.error)

"""Errors that the devices' drivers raise and the controller's services handle, defined apart from both."""

from __future__ import annotations


class DeviceError(RuntimeError):
    """A device (an OCS, a packet switch) refused, failed or could not be reached: what a reconfiguration rolls back
    from. Each driver's errors are kinds of it."""


class OcsUnavailable(DeviceError):
    """The device cannot be reached now."""


class Conflict(RuntimeError):
    """The request conflicts with the state of the rack (a running job, another request)."""


class Busy(Conflict):
    """Another reconfiguration holds the rack."""


class ReconfigFailed(RuntimeError):
    """A reconfiguration the devices refused or did not confirm (rolled back); `event` says how far it got."""

    def __init__(self, event):
        self.event = event  # the ReconfigEvent (controller/core/events.py)
        super().__init__(event.error)

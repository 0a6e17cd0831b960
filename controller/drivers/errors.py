"""The southbound devices' errors, each defined here and nowhere else. Every one is a kind of
`controller.core.errors.DeviceError` (what a reconfiguration rolls back from), or of `OcsUnavailable` where the device
cannot be reached or trusted now (its keeper tries again later); the message names the device."""
from __future__ import annotations

from controller.core.errors import DeviceError, OcsUnavailable


class SwitchError(DeviceError):
    """A switch refused a message, did not confirm in time, or went away; `datapaths`: which ones."""

    def __init__(self, message: str, datapaths: set[int] | None = None):
        super().__init__(message)
        self.datapaths = datapaths or set()


class Tl1Error(DeviceError):
    """A TL1 command the device denied."""


class NetconfError(DeviceError):
    """The device answered and refused (an rpc-error); what it holds is what it held before."""


class MalformedReply(DeviceError):
    """A reply that does not say what the driver asked."""


class LoginRefused(OcsUnavailable):
    """The device cannot be trusted or let us in: a host key other than the one known, a refused user or key. The
    driver changed nothing; it is not retried faster than any other unreachable device."""

"""Errors that the devices' drivers raise and the controller's services handle, defined apart from both."""

from __future__ import annotations


class DeviceError(RuntimeError):
    """A device (an OCS, a packet switch) refused, failed or could not be reached: what a reconfiguration rolls back
    from. Each driver's errors are kinds of it."""


class OcsUnavailable(DeviceError):
    """The device cannot be reached now."""

"""Errors that the devices' drivers raise and the controller's services handle, defined apart from both."""

from __future__ import annotations


class OcsUnavailable(RuntimeError):
    """The device cannot be reached now."""

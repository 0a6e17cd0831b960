"""The job service's errors, which the REST API maps to statuses (controller/apps/http.py)."""

from __future__ import annotations

from controller.core.errors import Busy, Conflict, ReconfigFailed  # noqa: F401 (the job service's names for them)


class UnknownJob(KeyError):
    """No job of that id."""

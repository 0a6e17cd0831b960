"""The job service's errors, which the REST API maps to statuses (controller/apps/http.py)."""

from __future__ import annotations


class UnknownJob(KeyError):
    """No job of that id."""

"""Fixtures of the unit tests."""

from __future__ import annotations

import time

import pytest

from tests.unit.virtual import VirtualRuntime


@pytest.fixture
def vrt(monkeypatch):
    """A runtime on virtual time (tests/unit/virtual.py), with the wall clock's sleeps made to raise: a test that
    takes it cannot wait on the wall clock, however deep the wait."""

    def no_sleep(seconds=0, *_):
        raise AssertionError(f"a test on virtual time slept {seconds} s on the wall clock")

    import eventlet  # imported by Ryu already (importing it first warns that it is deprecated)
    from ryu.lib import hub

    for where in (time, hub, eventlet, eventlet.greenthread):
        monkeypatch.setattr(where, "sleep", no_sleep)
    rt = VirtualRuntime()
    yield rt
    rt.close()

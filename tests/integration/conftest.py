"""Integration fixtures: real Open vSwitch, Mininet, Docker and Ryu. Needs root.

Outside CI a missing prerequisite skips these tests with the reason; in CI (CI=true) it fails them.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.integration.helpers import ControllerProcess

pytestmark = pytest.mark.integration


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "integration tests need root (they create bridges, namespaces and containers)"
    for tool in ("ovs-vsctl", "mn", "docker", "iperf3", "ethtool"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run make setup)"
    if subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode != 0:
        return "Open vSwitch is not running (run make setup)"
    return None


@pytest.fixture(scope="session", autouse=True)
def _prerequisites():
    reason = _missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"integration prerequisites missing in CI: {reason}")
        pytest.skip(reason)


@pytest.fixture
def controller(tmp_path):
    """An optirack-controller started the documented way, on free ports; stopped afterwards."""
    proc = ControllerProcess(tmp_path)
    proc.start()
    yield proc
    proc.stop()

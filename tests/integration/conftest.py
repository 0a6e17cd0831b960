"""Integration fixtures: real Open vSwitch, Mininet, Docker and Ryu. Needs root.

Outside CI a missing prerequisite skips these tests with the reason; in CI (CI=true) it fails them.

Fixtures (see tests/integration/testbed.py):

- ``bed`` — use this. The shared testbed (the paper rack, `topologies/paper-testbed.yaml`, and one
  controller started the documented way), clean before the test and cleaned after it, pass or fail:
  no queued or active job, no container labelled ``org.optirack.rack``, every GPU NIC at home, the rack
  file's circuits on the controller and on the OCS bridge, the switches' tables as the controller
  computes them, the controller running with its default options. Jobs a test started are
  stopped and waited for. If that cannot be reached the testbed is rebuilt from scratch, so one
  failure stays one failure. Attributes: ``bed.client`` (REST, with the token), ``bed.controller``
  (``url``, ``of_target``, ``state_dir``, ``output()``), ``bed.rack`` (the parsed rack file),
  ``bed.initial`` (the circuits every test starts from), ``bed.containers()``.
  A test that needs other controller options writes
  ``with bed.options("--optirack-worker-image", "x:1") as client: ...``; the default controller
  is back afterwards. ``bed.restart()`` restarts it on the same ports and state. Do not bring a
  rack up or down in a test that uses ``bed``.
- ``testbed`` — the same object without the cleaning (session scope); only for fixtures.
- ``controller`` — a controller of its own (free ports, own state directory) and no rack, for
  tests that build their own bridges or rack. A test that does not use ``bed`` gets the shared
  testbed taken down first (so its rack-up cannot collide with it); such tests run after all
  those that share it (tests/conftest.py orders them).
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from controller.core.rack import load_rack
from tests.integration.helpers import PAPER, ControllerProcess
from tests.integration.testbed import SharedTestbed

_shared: SharedTestbed | None = None


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


@pytest.fixture(scope="session")
def testbed(tmp_path_factory):
    """The shared paper rack and controller (not cleaned: tests use `bed`)."""
    global _shared
    if _shared is None:
        _shared = SharedTestbed(load_rack(PAPER), PAPER, tmp_path_factory.mktemp("testbed"))
    yield _shared.ensure_up()
    _shared.release()


@pytest.fixture
def bed(testbed):
    """The shared testbed, clean before the test and cleaned after it, pass or fail."""
    testbed.clean()
    yield testbed
    testbed.clean()


@pytest.fixture(scope="module", autouse=True)
def _rack_owner(request):
    """A module whose tests do not share the testbed may bring up its own rack (often in a
    module-scoped fixture): take the shared one down first. Module scope and autouse put this
    before the module's own fixtures."""
    mine = [item for item in request.session.items if item.module is request.module]
    if _shared is not None and not any("testbed" in item.fixturenames for item in mine):
        _shared.release()


@pytest.fixture(autouse=True)
def _rack_owner_of_test(request):
    """The same for one test, in a module where others share the testbed (function-scoped
    fixtures that bring up a rack come after this one)."""
    if "testbed" not in request.fixturenames and _shared is not None:
        _shared.release()


@pytest.fixture
def controller(tmp_path):
    """An optirack-controller started the documented way, on free ports; stopped afterwards."""
    proc = ControllerProcess(tmp_path)
    proc.start()
    yield proc
    proc.stop()

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


FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]


@pytest.fixture
def fresh(bed):
    """The shared testbed (its paper rack is the four-engine one) with the fragmented start, every server awake and
    every engine up, no job active; afterwards the same (pass or fail), then the `bed` fixture's cleaning: a test that
    hangs or kills a server need not bring it back itself."""
    from emulation import engines, servers
    from tests.integration.helpers import rack_cli, wait_for

    plans = {p.server: p for p in engines.engine_plans(bed.rack)}

    def settle():
        for server, plan in plans.items():
            servers.wake(plan)  # a hung one continues (nothing to continue on the others)
            if engines.pid_of(plan) is None:
                rack_cli("server", "start", server)
        wait_for(lambda: not any(j["state"] in ("pending", "configuring", "running", "recovering")
                                 for j in bed.client.get("/jobs")["jobs"]), 120, "earlier jobs to end")
        wait_for(lambda: all(s["engine"]["up"] for s in bed.client.get("/topology")["servers"].values()), 60,
                 "the controller to see every engine up")
    settle()
    bed.client.put("/ocs/circuits", {"circuits": FRAGMENTED})
    yield bed
    settle()


@pytest.fixture
def driver(bed):
    """The container driver itself, on the shared rack's engines."""
    from controller.drivers.containers import ContainerDriver
    from tests.integration.helpers import worker_image

    return ContainerDriver(bed.rack, worker_image())

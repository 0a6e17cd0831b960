"""The emulated testbed the integration tests share, and the cleanup that returns it to a known state.

One paper rack and one controller serve every test that asks for them; `SharedTestbed.clean()`
runs before and after each such test (the `bed` fixture) and leaves: no queued or active job, no container
labelled `org.optirack.rack`, every GPU NIC at home, the controller running with its default
options, the rack file's circuits on the controller *and* on the OCS bridge, and the switches'
tables equal to what the controller computes. When the gentle way fails it rebuilds the testbed
from scratch, so one broken test cannot break the ones after it.
"""
from __future__ import annotations

import logging
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import docker

from controller.client import ApiError, Client
from controller.core.aggregators import tables as compute_tables  # the NICs' entries and the aggregators'
from controller.core.circuits import CircuitMap
from controller.core.emulated import netns_of, nic_plans
from controller.core.jobs import ACTIVE, QUEUED
from controller.core.rack import Rack
from controller.drivers.containers import LABEL_GPU, LABEL_JOB, LABEL_RACK, ContainerDriver
from emulation import harness, nics, ovs
from emulation import netns as ns
from emulation import rack as rackmod
from tests.integration.helpers import worker_image

LOG = logging.getLogger("optirack.tests")
JOB_END_TIMEOUT = 120.0  # seconds to wait for jobs to stop before rebuilding the testbed


class Unclean(AssertionError):
    """The testbed is not in its known state (says what is left)."""


def device_circuits(rack: Rack) -> list[list[str]]:
    """The circuits the OCS bridges themselves hold, as the REST API writes them."""
    return sorted([f"{o}:{a}", f"{o}:{b}"] for o in rack.ocs for a, b in ovs.circuits_of(ovs.circuit_flows(o)))


_IP_RULE = re.compile(r"n_bytes=(\d+),.*\bip,.*nw_dst=([0-9.]+)\s.*actions=output:\"?(\d+)")


def ip_rules(switch: str) -> dict[tuple[str, int], int]:
    """A packet switch's IPv4 forwarding rules: (NIC address, output port) -> bytes they forwarded."""
    rules = {}
    for line in ovs.ofctl("dump-flows", switch).splitlines():
        m = _IP_RULE.search(line)
        if m:
            rules[(m.group(2), int(m.group(3)))] = int(m.group(1))
    return rules


def switch_tables(rack: Rack) -> dict[str, dict[str, int]]:
    """What each packet switch itself holds: NIC address -> output port."""
    return {w: {ip: port for ip, port in ip_rules(w)} for w in rack.switches}


def uplink_counters(rack: Rack) -> dict[tuple[str, str, int], int]:
    """Bytes forwarded by every IPv4 rule that points at an inter-switch uplink:
    (switch, NIC address, port) -> n_bytes. What such a rule counts crossed that uplink."""
    out = {}
    for w in rack.spec.switches:
        uplinks = {u.port for u in w.uplinks}
        for (ip, port), n in ip_rules(w.name).items():
            if port in uplinks:
                out[(w.name, ip, port)] = n
    return out


def uplink_bytes(before: dict, after: dict, ips: set[str]) -> int:
    """Bytes addressed to `ips` that crossed an uplink between two `uplink_counters` readings
    (a rule the fabric re-installed meanwhile counts from zero: read windows without circuit changes)."""
    total = 0
    for key, n in after.items():
        if key[1] in ips:
            prev = before.get(key, 0)
            total += n - prev if n >= prev else n
    return total


class SharedTestbed(harness.Testbed):
    """A `Testbed` that can be cleaned, restarted with other controller options, rebuilt and released."""

    def __init__(self, rack: Rack, rack_file: Path, workdir: Path):
        super().__init__(rack, rack_file, workdir)
        self.workdir = Path(workdir)
        self.initial = CircuitMap.initial(rack).to_json()
        self.driver = ContainerDriver(rack, worker_image())
        self.up = False

    # --- bring up, take down ------------------------------------------------------------
    def ensure_up(self) -> SharedTestbed:
        if not self.up:
            self.__enter__()
            self.up = True
        return self

    def release(self) -> None:
        """Take the rack down and stop the controller (for tests that bring up a rack of their own)."""
        if self.up:
            self.up = False
            self.__exit__(None, None, None)

    def rebuild(self, why: str) -> None:
        """From scratch: controller stopped, rack down (containers by label too), state forgotten."""
        LOG.warning("rebuilding the shared testbed: %s", why)
        print(f"\n[testbed] rebuilding the shared testbed: {why}")
        self.release()
        shutil.rmtree(self.controller.state_dir, ignore_errors=True)
        self.controller = harness.ControllerProcess(self.workdir, self.rack_file, [], self.controller.of_port,
                                                    self.controller.rest_port)
        self.ensure_up()

    # --- the controller --------------------------------------------------------------------
    def restart(self, *extra: str, engines: bool = True) -> Client:
        """Stop the controller and start it again on the same ports and state, with `extra` options; wait until its
        datapaths are in step and (`engines`) it sees every engine up (not where a test left a server dead)."""
        old = self.controller
        old.stop()
        self.controller = harness.ControllerProcess(old.state_dir.parent, self.rack_file, list(extra), old.of_port,
                                                    old.rest_port)
        self.controller.start()
        self.client = self.controller.client()
        harness.wait_for(self._ready if engines else self._devices_ready, 30,
                         "the restarted controller to resynchronise")
        return self.client

    @contextmanager
    def options(self, *extra: str):
        """`with bed.options("--optirack-worker-image", "x:1") as client:` a controller with other
        options; the default one is back afterwards, pass or fail."""
        try:
            yield self.restart(*extra)
        finally:
            self.restart()

    # --- cleaning ----------------------------------------------------------------------------
    def clean(self) -> None:
        """Return to the known state; rebuild from scratch if the gentle way does not get there."""
        self.ensure_up()
        try:
            self._clean()
            self.check_clean()
        except Exception as e:  # noqa: BLE001 (anything left: start over rather than fail the next test)
            self.rebuild(f"{e.__class__.__name__}: {e}")
            self._clean()
            self.check_clean()

    def _clean(self) -> None:
        if self.controller.extra or not self._controller_answers():
            self.restart()
        if not self._rack_is_ours():
            self.release()
            self.ensure_up()
        harness.wait_for(self._ready, 30, "every datapath to connect and get its flows, and every engine to be seen up")
        self.stop_jobs()
        self.remove_containers()
        self.nics_home()
        if self.client.get("/ocs/circuits")["circuits"] != sorted(self.initial):
            self.client.put("/ocs/circuits", {"circuits": self.initial})

    def _controller_answers(self) -> bool:
        proc = self.controller.proc
        if proc is None or proc.poll() is not None:
            return False
        try:
            self.client.get("/jobs")
            return True
        except ApiError:  # killed a moment ago, or hung
            return False

    def _rack_is_ours(self) -> bool:
        state = rackmod.RackState.load()
        return (state is not None and state.status == "up" and state.name == self.rack.name
                and state.controller == self.controller.of_target[4:] and set(state.bridges) <= set(ovs.rack_bridges()))

    def stop_jobs(self, timeout: float = JOB_END_TIMEOUT) -> list[str]:
        """Stop every queued and active job (one still being placed is waited for first); returns their
        ids. Queued ones first: stopped while a running one ends, each would start just to be stopped."""
        stopped: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.client.get("/jobs")["jobs"]
            active = [j for j in jobs if j["state"] == QUEUED] + [j for j in jobs if j["state"] in ACTIVE]
            if not active:
                return stopped
            if time.monotonic() > deadline:
                raise Unclean(f"jobs still active after {timeout:g} s: "
                              + ", ".join(f"{j['id']} ({j['state']})" for j in active))
            for job in active:
                if job["state"] in ("running", QUEUED):
                    try:
                        self.client.post(f"/jobs/{job['id']}/stop")
                        stopped.append(job["id"])
                    except ApiError as e:
                        if e.status != 409:  # 409: it changed state meanwhile; look again
                            raise
            time.sleep(0.2)

    def containers(self) -> list:
        """Every container labelled as this rack's (workers and their sandboxes), on every server's engine."""
        found = []
        for server in self.rack.servers:
            found += [(server, c) for c in self.driver.client(server).containers.list(
                all=True, ignore_removed=True, filters={"label": f"{LABEL_RACK}={self.rack.name}"})]
        return found

    def remove_containers(self) -> None:
        """By label, handing each NIC back first (the helper recreates one that died with its sandbox)."""
        for server, c in self.containers():
            gpu = c.labels.get(LABEL_GPU)
            if gpu in self.rack.gpus:
                self.driver.remove(c.labels.get(LABEL_JOB, ""), gpu, server)
        for _, c in self.containers():  # one the driver did not name (made by hand, or by an older driver)
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass

    def nics_home(self) -> None:
        """Every GPU NIC back in its server's namespace (remade on its port if a crash destroyed it)."""
        for plan in nic_plans(self.rack):
            if not ns.has_link(plan.ifname, netns_of(plan.server)):
                nics.make(plan, self.rack)

    def check_clean(self) -> None:
        """Raise `Unclean` naming what is left; checks the devices, not only the controller's record."""
        problems = []
        active = [j["id"] for j in self.client.get("/jobs")["jobs"] if j["state"] in (*ACTIVE, QUEUED)]
        if active:
            problems.append(f"queued or active jobs {active}")
        if self.containers():
            problems.append(f"containers {[c.name for _, c in self.containers()]}")
        held = self.client.get("/ocs/circuits")["circuits"]
        if held != sorted(self.initial):
            problems.append(f"the controller holds circuits {held}")
        if device_circuits(self.rack) != held:
            problems.append(f"the OCS holds {device_circuits(self.rack)}, the controller {held}")
        expected = compute_tables(self.rack, CircuitMap.parse(self.rack, held))
        if switch_tables(self.rack) != expected:
            problems.append(f"the switches hold {switch_tables(self.rack)}, the controller computes {expected}")
        missing = [g for g, s in self.rack.server_of.items() if not ns.has_link(self.rack.interface(g), netns_of(s))]
        if missing:
            problems.append(f"NICs not at home: {missing}")
        if problems:
            raise Unclean("; ".join(problems))

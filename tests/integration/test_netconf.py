"""The controller (a real process) drives a NETCONF OCS: Debian's netconfd serving optirack's model, with the
emulation's agent following its datastore (no bridge: nothing here touches the shared rack). A regroup, a change
refused because another session holds the candidate's lock, and netconfd killed in the middle of a change: each
change is all or nothing, and a server that comes back without its cross-connects gets them restored."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import yaml

from controller.client import ApiError
from controller.core.rack import Ocs
from controller.drivers.netconf import NetconfOcs
from controller.drivers.netconf_transport import Address, connect
from emulation import netconf_ocs
from tests.integration.helpers import PAPER, ControllerProcess, free_port, wait_for

pytestmark = pytest.mark.integration

REGROUPED = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:13"], ["ocs1:4", "ocs1:14"],
             ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]]


class Device:
    """netconfd and the agent, and a session of the test's own to read what the server holds."""

    def __init__(self, run_dir, port: int, starting):
        self.run_dir, self.port = run_dir, port
        netconf_ocs.start(run_dir, port, None, 25, startup=starting)

    def circuits(self) -> list[list[str]]:
        spec = Ocs(name="ocs1", ports=320, dpid=1, driver="netconf", address=f"tcp-ncx://127.0.0.1:{self.port}")
        d = NetconfOcs(spec, netconf_ocs.USER, "", timeout=10)
        try:
            return sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in d.read())
        finally:
            d.close()

    def pid(self) -> int:
        return int((self.run_dir / "netconfd.pid").read_text())


@pytest.fixture
def netconf_controller(tmp_path):
    port = free_port()
    data = yaml.safe_load(PAPER.read_text())
    data["ocs"][0].update(driver="netconf", address=f"tcp-ncx://127.0.0.1:{port}")
    rack_file = tmp_path / "netconf-rack.yaml"
    rack_file.write_text(yaml.safe_dump(data))
    starting = {(int(a.split(":")[1]), int(b.split(":")[1])) for a, b in data["circuits"]}
    device = Device(tmp_path / "ocs1", port, {(min(p), max(p)) for p in starting})
    ctl = ControllerProcess(tmp_path, rack_file, ["--optirack-netconf-user", netconf_ocs.USER,
                                                  "--optirack-device-probe-interval", "0.5",
                                                  "--optirack-device-retry-max", "1"])
    try:
        ctl.start()
        client = ctl.client()
        wait_for(lambda: client.get("/topology")["ocs"]["ocs1"]["synchronised"], 30, "first contact over NETCONF")
        yield ctl, client, device
    finally:
        ctl.stop()
        netconf_ocs.stop(device.run_dir)
        assert not netconf_ocs.listening(port), "netconfd still listens after stop"


def _circuits(client) -> list[list[str]]:
    return sorted(client.get("/ocs/circuits")["circuits"])


def test_a_regroup_is_one_commit_on_the_server(netconf_controller):
    ctl, client, device = netconf_controller
    ev = client.put("/ocs/circuits", {"circuits": REGROUPED})["event"]
    assert ev["status"] == "ok" and ev["dark_window_s"] >= 0.025
    assert device.circuits() == sorted(REGROUPED) == _circuits(client)
    assert "Traceback" not in ctl.output()
    # netconfd keeps its transaction id in the server's run directory (--yuma-home), not in root's ~/.yuma
    assert (device.run_dir / "yuma" / "data" / "startup-cfg-txid.txt").read_text().strip().isdigit()


def test_a_locked_candidate_refuses_the_change_and_nothing_moves(netconf_controller):
    _, client, device = netconf_controller
    before = _circuits(client)
    other = connect(Address("tcp-ncx", "127.0.0.1", device.port), "operator", timeout=10)  # someone else's session
    other.lock(target="candidate")
    try:
        with pytest.raises(ApiError) as info:
            client.put("/ocs/circuits", {"circuits": REGROUPED})
        ev = client.get("/events", limit=1)["events"][-1]
        assert ev["status"] == "failed" and "lock of the candidate datastore" in ev["error"]
        assert "locked by another session" in ev["error"] and "port" in ev["error"], ev["error"]
        assert info.value.status >= 400
        assert device.circuits() == before == _circuits(client)
    finally:
        other.unlock(target="candidate")
        other.close_session()
    client.put("/ocs/circuits", {"circuits": REGROUPED})  # the lock released, the same change goes through
    assert device.circuits() == sorted(REGROUPED)


def test_the_server_killed_mid_change_leaves_all_or_nothing_and_is_restored(netconf_controller):
    ctl, client, device = netconf_controller
    before = _circuits(client)
    os.kill(device.pid(), signal.SIGSTOP)  # the server hangs: the change waits in the middle of its RPCs
    outcome = {}

    def change():
        try:
            outcome["event"] = client.put("/ocs/circuits", {"circuits": REGROUPED})
        except ApiError as e:
            outcome["error"] = e

    t = threading.Thread(target=change)
    t.start()
    wait_for(lambda: [e["status"] for e in client.get("/events", limit=1)["events"]] == ["running"], 15,
             "the change to start")
    time.sleep(0.3)
    os.kill(device.pid(), signal.SIGKILL)  # power cut in the middle of the change
    t.join(30)
    assert "error" in outcome, outcome
    ev = client.get("/events", limit=1)["events"][-1]
    assert ev["status"] == "failed" and "NETCONF" in ev["error"], ev
    assert _circuits(client) == before  # nothing of the change was kept
    wait_for(lambda: not client.get("/topology")["ocs"]["ocs1"]["connected"], 15, "the lost session to show")

    (device.run_dir / "startup-cfg.xml").unlink()  # it comes back having lost its cross-connects
    netconf_ocs.start_server(device.run_dir, device.port)
    wait_for(lambda: device.circuits() == before, 30, "the controller to restore the server's cross-connects")
    # the server holds them once committed; the restore event ends after the driver's read-back
    last = lambda: client.get("/events", limit=1)["events"][-1]  # noqa: E731
    wait_for(lambda: last()["kind"] == "restore" and last()["status"] != "running", 15, "the restore to end")
    assert last()["status"] == "ok", last()
    assert _circuits(client) == before
    assert "Traceback" not in ctl.output()


def test_the_paper_rack_behind_netconf_follows_the_server_and_rack_down_ends_it(tmp_path):
    """topologies/paper-netconf.yaml brought up bare (its bridges, no servers): the rack starts netconfd and the
    agent, a regroup reaches the OCS bridge's flows through them, and rack-down ends both."""
    from controller.core.emulated import RUN_DIR
    from controller.core.rack import load_rack
    from emulation.harness import Testbed
    from emulation.netconf_ocs import Agent
    from tests.integration.helpers import ROOT

    rack_file = ROOT / "topologies" / "paper-netconf.yaml"
    rack = load_rack(rack_file)
    port = int(rack.spec.ocs[0].address.rsplit(":", 1)[1])
    run = RUN_DIR / "netconf-ocs1"
    bridge = Agent(port, "ocs1", 25)
    with Testbed(rack, rack_file, tmp_path, bare=True) as tb:
        assert (run / "netconfd.pid").exists() and (run / "agent.pid").exists()
        starting = {(min(a.port, b.port), max(a.port, b.port)) for a, b in rack.spec.circuits}
        assert bridge.read_bridge() == starting
        tb.client.put("/ocs/circuits", {"circuits": REGROUPED})
        want = {(int(a.split(":")[1]), int(b.split(":")[1])) for a, b in REGROUPED}
        wait_for(lambda: bridge.read_bridge() == want, 10, "the agent to make the regroup on the OCS bridge")
    assert not run.exists() and not netconf_ocs.listening(port)

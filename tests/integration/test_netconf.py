"""The controller (a real process) drives a NETCONF OCS as a lab's is reached: over SSH to our own sshd (Debian's
OpenSSH, its host key checked against a known_hosts file, a key-based user), whose netconf-subsystem hands the session
to Debian's netconfd serving optirack's model, with the emulation's agent following the datastore. A regroup; a change
refused because another session holds the candidate's lock; netconfd killed in the middle of a change; a wrong host
key, a refused user and a closed port; a change the model's whole check refuses, at the commit; the controller killed
(kill -9) between the confirmed commit and its confirm, the switch undoing the change by itself, on its datastore and
on an OVS bridge of the test's own."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from controller.client import ApiError
from controller.core.errors import OcsUnavailable
from controller.core.rack import Ocs
from controller.drivers.errors import LoginRefused, NetconfError
from controller.drivers.netconf import NetconfOcs
from controller.drivers.netconf_transport import _NCX_MAGIC, Address, connect
from emulation import netconf_ocs, netconf_ssh
from emulation.netconf_agent import Agent
from tests.integration.helpers import PAPER, ControllerProcess, free_port, wait_for

pytestmark = pytest.mark.integration

REGROUPED = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:13"], ["ocs1:4", "ocs1:14"],
             ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]]
USER = "optirack-nct"  # the test's login on its sshd (made if missing, removed if made)
RPCS = {"lock", "edit-config", "commit", "get-config", "confirm", "unlock"}


def _pairs(circuits) -> set[tuple[int, int]]:
    return {tuple(sorted(int(x.split(":")[1]) for x in c)) for c in circuits}


class Device:
    """sshd, netconfd and the agent (on `bridge`, if given), in a run directory under /run (the SSH user reads its
    authorized_keys and reaches netconfd's socket there), and the test's own reads of what the server holds."""

    def __init__(self, starting, bridge: str | None = None, confirm_timeout: float = 10):
        self.run_dir = Path(tempfile.mkdtemp(dir="/run", prefix="optirack-nctest-"))
        self.port, self.bridge = free_port(), bridge
        self.key = netconf_ssh.keygen(self.run_dir / "client-key", "optirack test")
        self.known_hosts = self.run_dir / "known_hosts"
        try:
            netconf_ocs.start(self.run_dir, 0, bridge, 25, startup=starting,
                              ssh={"port": self.port, "user": USER, "client_keys": [self.key]})
        except BaseException:
            self.stop()
            raise
        netconf_ssh.write_known_hosts(self.known_hosts, "127.0.0.1", self.port, self.run_dir / "ssh_host_ed25519_key")
        self.address = f"ssh://{USER}@127.0.0.1:{self.port}?known_hosts={self.known_hosts}&keyfile={self.key}"

    def driver(self, address: str | None = None, **kw) -> NetconfOcs:
        spec = Ocs(name="ocs1", ports=320, dpid=1, driver="netconf", address=address or self.address)
        return NetconfOcs(spec, USER, timeout=30, **kw)

    def circuits(self) -> list[list[str]]:
        d = self.driver()
        try:
            return sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in d.read())
        finally:
            d.close()

    def netconfd(self) -> int:
        return int((self.run_dir / "netconfd.pid").read_text())

    def stop(self) -> None:
        netconf_ocs.stop(self.run_dir)
        netconf_ocs.forget(self.run_dir)


@pytest.fixture(scope="module")
def ssh_user():
    made = netconf_ssh.ensure_user(USER)
    yield USER
    if made:
        netconf_ssh.remove_user(USER)


def _controller(tmp_path, device: Device, extra=()):
    data = yaml.safe_load(PAPER.read_text())
    data["ocs"][0].update(driver="netconf", address=device.address)
    rack_file = tmp_path / "netconf-rack.yaml"
    rack_file.write_text(yaml.safe_dump(data))
    return ControllerProcess(tmp_path, rack_file, ["--optirack-device-probe-interval", "0.5",
                                                   "--optirack-device-retry-max", "1", *extra])


def _starting() -> set[tuple[int, int]]:
    return _pairs(yaml.safe_load(PAPER.read_text())["circuits"])


@pytest.fixture
def netconf_controller(tmp_path, ssh_user):
    device = Device(_starting())
    ctl = _controller(tmp_path, device)
    try:
        ctl.start()
        client = ctl.client()
        wait_for(lambda: client.get("/topology")["ocs"]["ocs1"]["synchronised"], 30, "first contact over SSH")
        yield ctl, client, device
    finally:
        ctl.stop()
        device.stop()
        assert not netconf_ocs.listening(device.port), "sshd still listens after stop"


def _circuits(client) -> list[list[str]]:
    return sorted(client.get("/ocs/circuits")["circuits"])


def test_a_regroup_is_one_commit_on_the_server(netconf_controller):
    ctl, client, device = netconf_controller
    ev = client.put("/ocs/circuits", {"circuits": REGROUPED})["event"]
    assert ev["status"] == "ok" and ev["dark_window_s"] >= 0.025
    assert device.circuits() == sorted(REGROUPED) == _circuits(client)
    assert "Traceback" not in ctl.output()
    # over SSH, one confirmed commit: lock, edit-config, commit, get-config, the confirm, unlock (the driver's log)
    line = [x for x in ctl.output().splitlines() if "NETCONF change (ms)" in x][-1]
    assert set(json.loads(line.split("NETCONF change (ms) ", 1)[1])) == RPCS | {"switching-wait", "total"}, line
    assert f"Accepted publickey for {USER}" in (device.run_dir / "sshd.log").read_text()
    # netconfd keeps its transaction id in the server's own files (--yuma-home, on tmpfs), not in root's ~/.yuma
    assert (netconf_ocs.store(device.run_dir) / "yuma" / "data" / "startup-cfg-txid.txt").read_text().strip().isdigit()


def test_a_locked_candidate_refuses_the_change_and_nothing_moves(netconf_controller):
    _, client, device = netconf_controller
    before = _circuits(client)
    sock = Address("tcp-ncx", str(device.run_dir / "ncxserver.sock"), 0)
    other = connect(sock, "operator", timeout=10)  # someone else's session, on netconfd's own socket
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
    os.kill(device.netconfd(), signal.SIGSTOP)  # the server hangs: the change waits in the middle of its RPCs
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
    os.kill(device.netconfd(), signal.SIGKILL)  # power cut in the middle of the change
    t.join(30)
    assert "error" in outcome, outcome
    ev = client.get("/events", limit=1)["events"][-1]
    assert ev["status"] == "failed" and "NETCONF" in ev["error"], ev
    assert _circuits(client) == before  # nothing of the change was kept
    wait_for(lambda: not client.get("/topology")["ocs"]["ocs1"]["connected"], 15, "the lost session to show")

    netconf_ocs.startup_file(device.run_dir).unlink()  # it comes back having lost its cross-connects
    netconf_ocs.start_server(device.run_dir, ssh_port=device.port)  # the front stays: it reaches the new one
    wait_for(lambda: device.circuits() == before, 30, "the controller to restore the server's cross-connects")
    # the server holds them once committed; the restore event ends after the driver's read-back
    last = lambda: client.get("/events", limit=1)["events"][-1]  # noqa: E731
    wait_for(lambda: last()["kind"] == "restore" and last()["status"] != "running", 15, "the restore to end")
    assert last()["status"] == "ok", last()
    assert _circuits(client) == before
    assert "Traceback" not in ctl.output()


def test_the_paper_rack_behind_netconf_over_ssh_follows_the_server_and_rack_down_ends_it(tmp_path):
    """topologies/paper-netconf.yaml brought up bare (its bridges, no servers): rack-up starts sshd, netconfd and the
    agent and makes the rack file's user, key and known_hosts; a regroup over SSH reaches the OCS bridge's flows;
    rack-down ends the three and removes the user it made."""
    from controller.core.emulated import RUN_DIR
    from controller.core.rack import load_rack
    from controller.drivers.netconf_transport import parse_address
    from emulation.harness import Testbed
    from tests.integration.helpers import ROOT

    rack_file = ROOT / "topologies" / "paper-netconf.yaml"
    rack = load_rack(rack_file)
    address = parse_address(rack.spec.ocs[0].address)
    assert address.transport == "ssh" and address.known_hosts and address.keyfile
    run = RUN_DIR / "netconf-ocs1"
    bridge = Agent(0, "ocs1", 25)
    existed = _user_exists(address.user)
    with Testbed(rack, rack_file, tmp_path, bare=True) as tb:
        assert all((run / f"{p}.pid").exists() for p in ("netconfd", "front", "agent", "sshd"))
        assert Path(address.known_hosts).exists() and _user_exists(address.user)
        starting = {(min(a.port, b.port), max(a.port, b.port)) for a, b in rack.spec.circuits}
        assert bridge.read_bridge() == starting
        tb.client.put("/ocs/circuits", {"circuits": REGROUPED})
        wait_for(lambda: bridge.read_bridge() == _pairs(REGROUPED), 10, "the agent to make the regroup on the bridge")
        assert f"Accepted publickey for {address.user}" in (run / "sshd.log").read_text()
    assert not run.exists() and not netconf_ocs.listening(address.port)
    assert _user_exists(address.user) == existed


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def test_a_wrong_host_key_a_refused_user_and_a_closed_port_name_the_switch_and_change_nothing(ssh_user):
    device = Device(_starting())
    try:
        before = device.circuits()
        other = netconf_ssh.keygen(device.run_dir / "other-host-key", "not the switch")
        netconf_ssh.write_known_hosts(device.run_dir / "wrong_known_hosts", "127.0.0.1", device.port, other)
        wrong_hosts = device.run_dir / "wrong_known_hosts"
        wrong = device.driver(device.address.replace(str(device.known_hosts), str(wrong_hosts)))
        with pytest.raises(LoginRefused, match=r"OCS ocs1: the SSH host key of ssh://127.0.0.1:\d+ .* is not the one"):
            wrong.apply(set(), {(7, 31)})
        assert not wrong.connected
        stranger = netconf_ssh.keygen(device.run_dir / "stranger-key", "not authorized")
        refused = device.driver(device.address.replace(str(device.key), str(stranger)))
        with pytest.raises(LoginRefused, match=rf"OCS ocs1: .* refused user '{USER}' with key"):
            refused.apply(set(), {(7, 31)})
        closed = device.driver(device.address.replace(f":{device.port}?", f":{free_port()}?"))
        with pytest.raises(OcsUnavailable, match=r"OCS ocs1: cannot reach NETCONF at ssh://127.0.0.1:\d+"):
            closed.read()
        assert device.circuits() == before  # none of them changed anything
        # a password logs in as well as a key
        netconf_ssh.set_password(USER, "optirack-test-pw")
        by_password = device.driver(device.address.split("&keyfile")[0], password="optirack-test-pw")
        assert sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in by_password.read()) == before
        by_password.close()
    finally:
        subprocess.run(["usermod", "-p", "*", USER], check=False)
        device.stop()


def test_the_model_s_whole_check_refuses_at_the_commit_and_nothing_moves(ssh_user):
    """The edit-config asks netconfd to check only the edited pairs (test-option "set"): a change the whole-datastore
    check refuses (an egress another pair holds: the model's unique egress) is refused at the commit, naming the
    port, and the switch holds what it held; the next change goes through. The session's socket sends each segment
    at once (TCP_NODELAY): an edit-config of hundreds of pairs is not held back by Nagle's algorithm."""
    device, d = Device(_starting()), None
    try:
        d = device.driver()
        before = d.read()
        a, b = min(before)
        with pytest.raises(NetconfError, match=r"OCS ocs1: confirmed commit \(.*refused"):
            d.apply(set(), {(300, b)})
        assert d.read() == before
        d.apply({(a, b)}, {(a, 300)})
        d.confirm()
        assert d.read() == before - {(a, b)} | {(a, 300)}
        assert d.manager._session.transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        if d is not None:
            d.close()
        device.stop()


def test_a_controller_killed_before_its_confirm_leaves_the_switch_as_it_was(tmp_path, ssh_user):
    """kill -9 between the confirmed commit and its confirm (--optirack-fault-hold-confirm): netconfd undoes the commit
    by itself, the agent puts the bridge's flows back, and the restarted controller finds the rack consistent."""
    bridge = f"nct{os.getpid() % 100000}"
    subprocess.run(["ovs-vsctl", "--may-exist", "add-br", bridge, "--", "set", "bridge", bridge,
                    "datapath_type=netdev", "fail-mode=secure"], check=True)
    device, ctl = None, None
    try:
        device = Device(_starting(), bridge=bridge)
        flows = Agent(0, bridge, 25)
        before = device.circuits()
        wait_for(lambda: flows.read_bridge() == _pairs(before), 10, "the agent to make the starting circuits")
        hold = ["--optirack-fault-hold-confirm", "--optirack-netconf-confirm-timeout", "5"]
        ctl = _controller(tmp_path, device, hold)
        ctl.start()
        client = ctl.client()
        wait_for(lambda: client.get("/topology")["ocs"]["ocs1"]["synchronised"], 30, "first contact over SSH")
        threading.Thread(target=lambda: _quietly(client.put, "/ocs/circuits", {"circuits": REGROUPED}),
                         daemon=True).start()
        wait_for(lambda: device.circuits() == sorted(REGROUPED), 15, "the confirmed commit on the server")
        wait_for(lambda: flows.read_bridge() == _pairs(REGROUPED), 10, "the agent to make it on the bridge")
        assert "held before its confirm" in ctl.output()
        killed = time.monotonic()
        ctl.kill()  # SIGKILL: its session ends with the change unconfirmed
        wait_for(lambda: device.circuits() == before, 5, "netconfd to undo the unconfirmed commit")
        wait_for(lambda: flows.read_bridge() == _pairs(before), 5, "the agent to put the bridge's flows back")
        assert time.monotonic() - killed < 5  # within the confirm timeout
        assert "netconfd undid an unconfirmed commit" in (device.run_dir / "agent.log").read_text()

        ctl = _controller(tmp_path, device)  # the same state directory: the restart's reconciliation
        ctl.start()
        client = ctl.client()
        wait_for(lambda: client.get("/topology")["ocs"]["ocs1"]["synchronised"], 30, "the restart's first contact")
        seen = client.get("/ocs/circuits", device=1)
        assert sorted(seen["circuits"]) == before == sorted(seen["device"]["ocs1"])
        assert "holds the expected 6 circuits" in ctl.output(), ctl.output()[-2000:]
        assert flows.read_bridge() == _pairs(before)
    finally:
        if ctl is not None:
            ctl.stop()
        if device is not None:
            device.stop()
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", bridge], check=True)


def _quietly(fn, *args):
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 (the controller is killed under this request)
        pass


def test_the_front_hands_netconfd_a_hello_apart_from_the_rpc_behind_it():
    """A client's <hello> and first RPC in one write (as a busy netconfd reads them when ncclient sends them back to
    back): through the front, netconfd answers the RPC (netconfd 2.13 alone leaves it unanswered)."""
    run_dir = Path(tempfile.mkdtemp(dir="/run", prefix="optirack-nctest-"))
    try:
        netconf_ocs.start_server(run_dir, startup={(1, 11)})
        netconf_ocs.start_front(run_dir)
        for _ in range(3):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(run_dir / "ncxserver.sock"))
                s.sendall(b'<ncx-connect xmlns="http://netconfcentral.org/ns/yuma-ncx" version="1" user="optirack" '
                          b'address="127.0.0.1" magic="%s" transport="ssh" port="830" />]]>]]>' % _NCX_MAGIC.encode())
                assert b"urn:ietf:params:netconf:base:1.1" in _until(s, b"]]>]]>"), "no <hello> from netconfd"
                rpc = (b'<rpc message-id="1" xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><get-config><source>'
                       b'<running/></source></get-config></rpc>')
                s.sendall(b'<hello xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><capabilities><capability>'
                          b'urn:ietf:params:netconf:base:1.1</capability></capabilities></hello>]]>]]>'
                          b"\n#%d\n%s\n##\n" % (len(rpc), rpc))
                reply = re.sub(rb"\n#\d+\n", b"", _until(s, b"\n##\n"))  # its chunks' headers out
                assert b"<rpc-reply" in reply and b"<ingress>1</ingress>" in reply, reply
    finally:
        netconf_ocs.stop(run_dir)
        netconf_ocs.forget(run_dir)


def _until(s: socket.socket, end: bytes, timeout: float = 5) -> bytes:
    got, deadline = b"", time.monotonic() + timeout
    while end not in got:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = s.recv(65536)
        except TimeoutError:
            raise AssertionError(f"no {end!r} within {timeout:g} s: {got[-300:]!r}") from None
        assert data, f"the connection ended: {got[-300:]!r}"
        got += data
    return got

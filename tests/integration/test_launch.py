"""The documented controller launch accepts OpenFlow 1.3 connections from OVS bridges."""
from __future__ import annotations

import signal
import socket
import struct
import subprocess
import time

import pytest

from tests.integration.helpers import BIN, ControllerProcess, sh, wait_for

BRIDGES = {"ortest0": 0x100, "ortest1": 0x201}  # datapath ids of ocs1 and as1 in the paper rack


@pytest.fixture
def bridges(controller):
    for name, dpid in BRIDGES.items():
        sh("ovs-vsctl", "--may-exist", "add-br", name, "--", "set", "bridge", name, "datapath_type=netdev",
           "protocols=OpenFlow13", "fail-mode=secure", f"other-config:datapath-id={dpid:016x}",
           "external-ids:optirack-test=launch", "--", "set-controller", name, controller.of_target)
    yield list(BRIDGES)
    for name in BRIDGES:
        sh("ovs-vsctl", "--if-exists", "del-br", name)


def test_bridges_connect_over_openflow13(controller, bridges):
    for name in bridges:
        wait_for(lambda n=name: sh("ovs-vsctl", "get", "controller", n, "is_connected").strip() == "true",
                 15, f"{name} to connect")
        assert sh("ovs-vsctl", "get", "bridge", name, "protocols").strip() == '[OpenFlow13]'
    wait_for(lambda: "datapath 0x201 (as1) connected, OpenFlow 1.3" in controller.output(), 10, "the controller's log")
    assert "datapath 0x100 (ocs1) connected, OpenFlow 1.3" in controller.output()


def _recv_message(sock) -> tuple[int, int]:
    header = b""
    while len(header) < 8:
        chunk = sock.recv(8 - len(header))
        assert chunk, "controller closed the connection"
        header += chunk
    version, msg_type, length, _xid = struct.unpack("!BBHI", header)
    body = length - 8
    while body > 0:
        body -= len(sock.recv(body))
    return version, msg_type


def test_echo_keepalive_is_on_by_default(tmp_path):
    """A switch that says hello and then nothing gets OpenFlow 1.3 echo requests from the controller."""
    conf = tmp_path / "ryu.conf"  # Ryu takes the echo interval from a config file only
    conf.write_text("[DEFAULT]\necho_request_interval = 1\n")
    proc = ControllerProcess(tmp_path, extra=["--config-file", str(conf)])
    proc.start()
    try:
        with socket.create_connection(("127.0.0.1", proc.of_port), timeout=10) as sock:
            sock.sendall(struct.pack("!BBHI", 4, 0, 8, 1))  # OFPT_HELLO, OpenFlow 1.3
            seen = set()
            deadline = time.monotonic() + 30  # one a second is due; the bound only catches none
            while 2 not in seen and time.monotonic() < deadline:  # 2 = OFPT_ECHO_REQUEST
                version, msg_type = _recv_message(sock)
                assert version == 4
                seen.add(msg_type)
            assert 2 in seen, f"no echo request; saw message types {sorted(seen)}"
        # Ryu shuts down slowly (10 s) while it still holds the half-closed connection: let it see the close.
        wait_for(
            lambda: not sh("ss", "-Htn", f"sport = :{proc.of_port}").strip(),
            10,
            "the controller to drop the connection",
        )
    finally:
        proc.stop()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_an_idle_controller_at_once(tmp_path, sig):
    """Ctrl-C or SIGTERM while no switch is connected: the interrupt used to land in the OpenFlow
    server's accept loop, which alone ended, and the controller ran on until it was killed."""
    proc = ControllerProcess(tmp_path)
    proc.start()
    try:
        time.sleep(1)  # idle: the servers wait in accept, the pollers sleep
        proc.proc.send_signal(sig)
        try:
            code = proc.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the controller still runs 5 s after {sig.name}:\n{proc.output()[-2000:]}")
        assert code == 0, proc.output()[-2000:]
    finally:
        proc.stop()


def test_the_queue_discipline_is_the_controllers_flag_and_the_cli_shows_it(tmp_path):
    """--optirack-queue sjf: `optirack jobs` says so, a submission without --estimate is refused naming estimate_s
    (nothing queued); a discipline the controller does not offer (las) stops it at once, naming the choices."""
    proc = ControllerProcess(tmp_path, extra=["--optirack-queue", "sjf"])
    proc.start()
    try:
        cli = [str(BIN / "optirack"), "--url", proc.url, "--token-file", str(proc.state_dir / "token")]
        listed = subprocess.run([*cli, "jobs"], capture_output=True, text=True, timeout=30)
        assert listed.returncode == 0 and listed.stdout.splitlines()[0] == "queue: sjf (shortest estimated job first)"
        refused = subprocess.run([*cli, "submit", "--gpus", "2"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and "400: estimate_s: required: this controller queues by sjf" in refused.stderr
        assert proc.client().get("/jobs")["jobs"] == []
    finally:
        proc.stop()
    las = subprocess.run([str(BIN / "optirack-controller"), "--optirack-queue", "las"], capture_output=True,
                         text=True, timeout=30)
    assert las.returncode != 0 and "las" in las.stderr and "fifo" in las.stderr, las.stderr[-2000:]

"""A TL1 OCS that restarts: the controller (a real process) reconnects and resynchronises it by
itself, and GET /topology answers from memory while the OCS is down or hung.

The OCS is the emulated TL1 switch (`python -m emulation.tl1_ocs`) run as a process and killed
with SIGKILL; while it is down a "hung" device (accepts TCP, never answers) stands on its port,
so a status read that logged in would wait for the driver's 30-s TL1 timeout. No bridges, no
containers: nothing here touches the shared rack.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from controller.drivers.tl1 import Tl1Client, parse_patches
from tests.integration.helpers import PAPER, ROOT, ControllerProcess, free_port, wait_for

REGROUPED = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:13"], ["ocs1:4", "ocs1:14"],
             ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]]


class Tl1Process:
    def __init__(self, port: int):
        self.port, self.proc = port, None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "emulation.tl1_ocs", "--port", str(self.port),
                                      "--password", "pw", "--switching-ms", "25"], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._listening, 15, "the emulated TL1 OCS to listen")

    def _listening(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def patches(self) -> list[list[str]]:
        c = Tl1Client("127.0.0.1", self.port, timeout=5)
        try:
            c.command("ACT-USER", "admin", "pw")
            return sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in parse_patches(c.command("RTRV-PATCH")))
        finally:
            c.close()


class HungDevice:
    """Accepts TCP connections on the OCS's port and never answers."""

    def __init__(self, port: int):
        self.sock = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.accepted:
            c.close()


@pytest.fixture
def tl1_controller(tmp_path):
    port = free_port()
    data = yaml.safe_load(PAPER.read_text())
    data["ocs"][0].update(driver="tl1", address=f"127.0.0.1:{port}")
    rack_file = tmp_path / "tl1-rack.yaml"
    rack_file.write_text(yaml.safe_dump(data))
    device = Tl1Process(port)
    device.start()
    ctl = ControllerProcess(tmp_path, rack_file, ["--optirack-tl1-password", "pw", "--optirack-device-probe-interval",
                                                  "0.5", "--optirack-device-retry-max", "2"])
    try:
        ctl.start()
        yield ctl, ctl.client(), device
    finally:
        ctl.stop()
        device.kill()


def _ocs(client) -> dict:
    return client.get("/topology")["ocs"]["ocs1"]


def test_a_restarted_tl1_ocs_is_reconnected_and_resynchronised(tl1_controller):
    ctl, client, device = tl1_controller
    wait_for(lambda: _ocs(client)["synchronised"], 30, "first contact with the TL1 OCS")
    client.put("/ocs/circuits", {"circuits": REGROUPED})
    assert device.patches() == sorted(REGROUPED)

    device.kill()  # power cut: sessions reset, the cross-connects are lost with the process
    hung = HungDevice(device.port)
    try:
        wait_for(lambda: not _ocs(client)["connected"], 15, "the controller to notice the lost session")
        wait_for(lambda: hung.accepted, 15, "the driver to try again by itself")  # it is now stuck in a login
        slowest = 0.0
        for _ in range(5):
            t0 = time.monotonic()
            status = _ocs(client)
            slowest = max(slowest, time.monotonic() - t0)
            assert status["connected"] is False and status["last_seen"] is not None and status["error"]
        print(f"GET /topology while the OCS hangs: slowest of 5 took {slowest * 1000:.0f} ms")
        assert slowest < 10.0  # a login in the request path would wait out the driver's 30-s TL1 timeout
    finally:
        hung.close()

    device.start()  # back, empty
    wait_for(lambda: _ocs(client)["synchronised"], 60, "the controller to reconnect and resynchronise by itself")
    assert device.patches() == sorted(REGROUPED)
    restore = client.get("/events", limit=1)["events"][-1]
    assert restore["kind"] == "restore" and restore["status"] == "ok"
    assert sorted(restore["added"]) == sorted(REGROUPED)
    assert "Traceback" not in ctl.output()

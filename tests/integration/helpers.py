"""Helpers shared by the integration tests: a controller process, polling, OVS queries."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PAPER = ROOT / "topologies" / "paper-testbed.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll until `predicate()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def sh(*cmd: str, check: bool = True, **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


class ControllerProcess:
    """`optirack-controller` as a user runs it, on its own ports and state directory."""

    def __init__(self, tmp_path: Path, rack: Path = PAPER, extra: list[str] | None = None):
        self.state_dir = tmp_path / "state"
        self.log_path = tmp_path / "controller.log"
        self.of_port, self.rest_port = free_port(), free_port()
        self.rack, self.extra = rack, extra or []
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def of_target(self) -> str:
        return f"tcp:127.0.0.1:{self.of_port}"

    def start(self) -> None:
        cmd = [str(BIN / "optirack-controller"), "--optirack-rack", str(self.rack),
               "--optirack-state-dir", str(self.state_dir), "--ofp-tcp-listen-port", str(self.of_port),
               "--wsapi-port", str(self.rest_port), *self.extra]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_for(self._listening, 30, "the controller to listen for OpenFlow")

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"controller exited {self.proc.returncode}:\n{self.output()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.of_port)) == 0

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


RACK8 = ROOT / "topologies" / "rack8-3as.yaml"


def optirack_rack(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "optirack-rack"), *args], capture_output=True, text=True, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"optirack-rack {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def ofctl(*args: str) -> str:
    return sh("ovs-ofctl", "-O", "OpenFlow13", *args)


def set_circuits_by_hand(ocs: str, pairs: list[tuple[int, int]]) -> None:
    ofctl("del-flows", ocs)
    for a, b in pairs:
        ofctl("add-flow", ocs, f"priority=100,in_port={a},actions=output:{b}")
        ofctl("add-flow", ocs, f"priority=100,in_port={b},actions=output:{a}")


def install_forwarding_by_hand(rack, circuits) -> None:
    """Flows from controller.core.forwarding, written with ovs-ofctl (no controller involved)."""
    from controller.core.forwarding import compute_tables

    for switch, table in compute_tables(rack, circuits).items():
        ofctl("del-flows", switch)
        for ip, port in table.items():
            ofctl("add-flow", switch, f"priority=10,ip,nw_dst={ip},actions=output:{port}")
            ofctl("add-flow", switch, f"priority=10,arp,arp_tpa={ip},actions=output:{port}")


def ping(netns: str, dst: str, count: int = 2) -> bool:
    return subprocess.run(["ip", "netns", "exec", netns, "ping", "-c", str(count), "-i", "0.2", "-W", "1", dst],
                          capture_output=True).returncode == 0


def iperf_mbps(server_ns: str, server_ip: str, client_ns: str, client_ip: str, seconds: int = 4,
               port: int = 5201) -> float:
    """TCP goodput from client to server in Mbit/s, as the receiver counted it."""
    import json

    server = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-B", server_ip, "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: subprocess.run(["ip", "netns", "exec", server_ns, "ss", "-ltn", f"sport = :{port}"],
                                        capture_output=True, text=True).stdout.count("LISTEN") > 0, 5, "iperf3 -s")
        out = sh("ip", "netns", "exec", client_ns, "iperf3", "-c", server_ip, "-B", client_ip, "-p", str(port),
                 "-t", str(seconds), "-O", "1", "-J", timeout=seconds + 20)
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        server.wait(10)

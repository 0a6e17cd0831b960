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

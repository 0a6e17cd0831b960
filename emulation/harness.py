"""A whole emulated testbed in one process's hands: the controller started the documented way,
and the rack brought up against it. Used by the experiment runner, the benchmarks and the tests.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from controller.client import Client
from controller.core.rack import Rack
from emulation import rack as rackmod

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll until `predicate()` is truthy; raise TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class ControllerProcess:
    """`optirack-controller` as a user runs it, on its own ports and state directory."""

    def __init__(self, workdir: Path, rack_file: Path, extra: list[str] | None = None,
                 of_port: int | None = None, rest_port: int | None = None):
        self.state_dir = Path(workdir) / "state"
        self.log_path = Path(workdir) / "controller.log"
        self.of_port, self.rest_port = of_port or free_port(), rest_port or free_port()
        self.rack_file, self.extra = rack_file, extra or []
        self.proc: subprocess.Popen | None = None
        self.log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def of_target(self) -> str:
        return f"tcp:127.0.0.1:{self.of_port}"

    def start(self) -> None:
        cmd = [str(BIN / "optirack-controller"), "--optirack-rack", str(self.rack_file),
               "--optirack-state-dir", str(self.state_dir), "--ofp-tcp-listen-port", str(self.of_port),
               "--wsapi-port", str(self.rest_port), *self.extra]
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_for(self._listening, 30, "the controller to listen")

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"controller exited {self.proc.returncode}:\n{self.output()[-3000:]}")
        with socket.socket() as s, socket.socket() as r:
            return s.connect_ex(("127.0.0.1", self.of_port)) == 0 and r.connect_ex(("127.0.0.1", self.rest_port)) == 0

    def output(self) -> str:
        if self.log:
            self.log.flush()
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self) -> Client:
        return Client(self.url, (self.state_dir / "token").read_text().strip())

    def kill(self) -> None:
        """SIGKILL: the controller dies where it stands, as on a crash (nothing of its own shutdown runs)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stop()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.log:
            self.log.close()
            self.log = None


def _exit_on_sigterm():
    """SIGTERM ends the process by SystemExit, so that a testbed brought up is taken down (a benchmark run in the
    background, where the shell ignores SIGINT for it, is stopped by SIGTERM; by default that ends Python at once and
    leaves the rack, its controller and its aggregators running). Only where nothing else handles SIGTERM, and only in
    the main thread; the handler before (to put back), or None where none was put in."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def stop(_sig, _frame):
        raise SystemExit(128 + signal.SIGTERM)

    return signal.signal(signal.SIGTERM, stop)


class Testbed:
    """Controller + emulated rack, brought up together and taken down together."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, rack: Rack, rack_file: Path, workdir: Path, extra: list[str] | None = None, quiet: bool = True,
                 bare: bool = False):
        self.rack, self.rack_file, self.bare = rack, rack_file, bare  # bare: bridges only (emulation.bare)
        self.controller = ControllerProcess(workdir, rack_file, extra)
        self.quiet = quiet

    def __enter__(self) -> Testbed:
        self._on_term = _exit_on_sigterm()
        self.controller.start()
        try:
            if self.bare:
                from emulation.bare import up_bare

                self.state = up_bare(self.rack, self.controller.of_target[4:], wait_connected=30)
            else:
                self.state = rackmod.up(self.rack, self.controller.of_target[4:], wait_connected=10)
            self.client = self.controller.client()
            wait_for(self._ready, 120 if self.bare else 30,
                     "every datapath to connect and get its flows, and every engine to be seen up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _devices_ready(self) -> bool:
        """Every datapath connected and in step (whatever the engines)."""
        topo = self.client.get("/topology")
        return all(d["connected"] and d["synchronised"] for d in list(topo["ocs"].values()) +
                   list(topo["switches"].values()))

    def _ready(self) -> bool:
        topo = self.client.get("/topology")
        devices = list(topo["ocs"].values()) + list(topo["switches"].values())
        # and, with engines, every one of them seen up by the controller: one that it first found down (the
        # controller starts before the rack) has its stale containers removed when it answers
        engines = [] if self.bare else [s["engine"]["up"] for s in topo["servers"].values()]
        return all(d["connected"] and d["synchronised"] for d in devices) and all(engines)

    def __exit__(self, *exc) -> None:
        try:
            rackmod.down(quiet=self.quiet)
        finally:
            self.controller.stop()
            if self._on_term is not None:
                signal.signal(signal.SIGTERM, self._on_term)
                self._on_term = None

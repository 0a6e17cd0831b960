"""TL1 driver for MEMS switches that speak TL1 over TCP (Polatis/Calient style, port 3082).

Commands used: ACT-USER (log in), RTRV-PATCH (list cross-connects), ENT-PATCH and DLT-PATCH
(make and delete cross-connects, several at once with '&'-joined port lists), CANC-USER.
A command completes with ``M <ctag> COMPLD`` or fails with ``M <ctag> DENY`` and an error code;
the device answers COMPLD to ENT-PATCH once the mirrors have settled.
"""
from __future__ import annotations

import itertools
import re
import socket
import threading

from controller.core.errors import OcsUnavailable
from controller.drivers.errors import Tl1Error
from controller.drivers.ocs import ApplyResult, OcsDriver, Pair
from controller.drivers.registry import DriverKind, Setting

DEFAULT_PORT = 3082
_RESPONSE_END = re.compile(rb"\r?\n;")
_STATUS = re.compile(r"^M\s+(\S+)\s+(COMPLD|DENY)", re.M)
_QUOTED = re.compile(r'^\s+"([^"]*)"', re.M)


class Tl1Client:
    """One TL1 session: send a command, read its response."""

    def __init__(self, host: str, port: int = DEFAULT_PORT, timeout: float = 30.0, lock=None):
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self._buf = b""
        self._ctags = itertools.count(1)
        # One command and its response at a time: the controller's runtime's lock (green), else a thread's.
        self._exchange = lock if lock is not None else threading.Lock()

    def open(self) -> socket.socket:
        self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self._buf = b""
        return self.sock

    def close(self) -> None:
        if self.sock:
            self.sock.close()
            self.sock = None

    def command(self, verb: str, aid: str = "", params: str = "") -> list[str]:
        """Run ``VERB::AID:CTAG::PARAMS;``; return the quoted lines of a COMPLD, raise Tl1Error on DENY."""
        with self._exchange:
            sock = self.sock if self.sock is not None else self.open()
            ctag = str(next(self._ctags))
            line = f"{verb}::{aid}:{ctag}" + (f"::{params}" if params else "") + ";"
            sock.sendall(line.encode() + b"\r\n")
            while True:
                text = self._read_response(sock)
                m = _STATUS.search(text)
                if m and m.group(1) == ctag:
                    break
        lines = _QUOTED.findall(text)
        if m.group(2) == "DENY":
            raise Tl1Error(f"{verb} {aid} denied: {' '.join(lines) or text.strip()}")
        return lines

    def _read_response(self, sock: socket.socket) -> str:
        while (m := _RESPONSE_END.search(self._buf)) is None:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("the TL1 peer closed the connection")
            self._buf += chunk
        text, self._buf = self._buf[: m.end()], self._buf[m.end():]
        return text.decode(errors="replace")


def parse_address(address: str | None) -> tuple[str, int]:
    """(host, port) of the rack file's ``address: host[:port]``; ValueError says what is wrong."""
    host, colon, port = (address or "").strip().partition(":")
    if not host or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"bad TL1 address {address!r}: host[:port] (port {DEFAULT_PORT} if none)")
    return host, int(port) if port else DEFAULT_PORT


def parse_patches(lines: list[str]) -> set[Pair]:
    pairs = set()
    for line in lines:
        a, _, b = line.partition(",")
        if a.strip().isdigit() and b.strip().isdigit():
            x, y = int(a), int(b)
            pairs.add((min(x, y), max(x, y)))
    return pairs


class Tl1Ocs(OcsDriver):
    """A real (or TL1-emulated) MEMS switch; `address` is host[:port] from the rack file."""

    def __init__(self, spec, user: str, password: str, timeout: float = 30.0, lock=None, **kw):
        super().__init__(spec, **kw)
        host, port = parse_address(spec.address)
        self.client = Tl1Client(host, port, timeout, lock)
        self.user, self.password = user, password
        self._logged_in = False

    def _session(self) -> Tl1Client:
        if not self._logged_in:
            try:
                self.client.open()
                self.client.command("ACT-USER", self.user, self.password)
            except (OSError, ConnectionError) as e:
                self._lost(f"cannot reach TL1 at {self.spec.address}: {e}")
            except Tl1Error as e:
                self._lost(f"login refused: {e}")
            self._logged_in = True
        return self.client

    def _lost(self, why: str):
        self._logged_in = False
        self.client.close()
        self.last_error = why
        raise OcsUnavailable(f"OCS {self.spec.name}: {why}") from None

    def _run(self, verb: str, aid: str = "") -> list[str]:
        try:
            lines = self._session().command(verb, aid)
        except (OSError, ConnectionError) as e:
            self._lost(f"TL1 session lost: {e}")
        self.seen()
        return lines

    @property
    def connected(self) -> bool:
        """Logged in as far as we know; a lost session is found by the next command (the OCS app probes)."""
        return self._logged_in

    def read(self) -> set[Pair]:
        return parse_patches(self._run("RTRV-PATCH"))

    def apply(self, remove: set[Pair], add: set[Pair], on_dark=None) -> ApplyResult:
        if remove:
            self._run("DLT-PATCH", "&".join(str(a) for a, _ in sorted(remove)))
        dark_start = self.clock()
        if on_dark is not None:
            on_dark()
        if not add:
            return ApplyResult(dark_start, None, 0.0)
        pairs = sorted(add)
        self._run("ENT-PATCH", "&".join(str(a) for a, _ in pairs) + "," + "&".join(str(b) for _, b in pairs))
        return ApplyResult(dark_start, self.clock(), self.switching_time_s(len(add)))

    def replace(self, circuits: set[Pair]) -> None:
        current = self.read()
        self.apply(current - circuits, circuits - current)

    def close(self) -> None:
        if self._logged_in:
            try:
                self.client.command("CANC-USER", self.user)
            except (OSError, ConnectionError, Tl1Error):
                pass
        self.client.close()
        self._logged_in = False


DRIVER = DriverKind(
    "tl1",
    "MEMS switches that speak TL1 over TCP (Calient/Polatis style)",
    address=f"host[:port], TCP, port {DEFAULT_PORT} if none",
    check=lambda spec: parse_address(spec.address) and None,
    build=lambda spec, w: Tl1Ocs(spec, w.settings["user"], w.settings["password"], lock=w.lock(), sleep=w.sleep),
    settings=(
        Setting("user", "admin", "login for OCS driven by the tl1 driver"),
        Setting("password", "", "password for OCS driven by the tl1 driver", secret=True),
    ),
)

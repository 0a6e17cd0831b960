"""An emulated MEMS switch that speaks TL1 on TCP, for testing the TL1 driver without hardware.

It keeps its cross-connects in memory, answers ENT-PATCH only after the switching time, and,
with --bridge, mirrors every cross-connect onto an OVS bridge of the emulated rack as
port-to-port flows, so traffic follows what the TL1 session set up.
"""
from __future__ import annotations

import argparse
import socket
import socketserver
import subprocess
import threading
import time

from controller.drivers.tl1 import DEFAULT_PORT


class Tl1Ocs:
    """The device: its ports, cross-connects and one set of credentials."""

    def __init__(self, ports: int = 320, switching_ms: float = 25.0, user: str = "admin", password: str = "root",
                 bridge: str | None = None, name: str = "OPTIRACK-OCS"):
        self.ports, self.switching_ms, self.user, self.password = ports, switching_ms, user, password
        self.bridge, self.name = bridge, name
        self.patches: dict[int, int] = {}  # both directions
        self.lock = threading.Lock()
        self.commands: list[str] = []  # every command received, for tests

    def _mirror(self, *args: str) -> None:
        if self.bridge:
            subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args], check=True, capture_output=True)

    def handle(self, verb: str, aid: str, params: str, session: dict) -> tuple[bool, list[str]]:
        """One command; returns (completed, quoted lines)."""
        self.commands.append(verb)
        if verb == "ACT-USER":
            if aid == self.user and params == self.password:
                session["user"] = aid
                return True, []
            return False, ["PLNA", "login not accepted"]
        if "user" not in session:
            return False, ["PLNA", "log in first (ACT-USER)"]
        if verb == "CANC-USER":
            session.clear()
            return True, []
        if verb == "RTRV-PATCH":
            with self.lock:
                return True, [f"{a},{b}" for a, b in sorted(self.patches.items()) if a < b]
        if verb == "ENT-PATCH":
            return self._enter(aid)
        if verb == "DLT-PATCH":
            return self._delete(aid)
        return False, ["ICNV", f"command {verb} not supported"]

    def _ports(self, text: str) -> list[int] | None:
        try:
            ports = [int(p) for p in text.split("&")]
        except ValueError:
            return None
        return ports if all(1 <= p <= self.ports for p in ports) else None

    def _enter(self, aid: str) -> tuple[bool, list[str]]:
        ins, _, outs = aid.partition(",")
        a, b = self._ports(ins), self._ports(outs)
        if a is None or b is None or len(a) != len(b):
            return False, ["IIAC", f"bad port list {aid!r} (ports are 1..{self.ports})"]
        flat = a + b
        with self.lock:
            if len(set(flat)) != len(flat) or any(p in self.patches for p in flat):
                return False, ["SROF", "a port is already connected or named twice"]
        time.sleep(self.switching_ms / 1000.0)  # the mirrors move
        with self.lock:
            for x, y in zip(a, b, strict=True):
                self.patches[x], self.patches[y] = y, x
                self._mirror("add-flow", self.bridge, f"priority=100,in_port={x},actions=output:{y}")
                self._mirror("add-flow", self.bridge, f"priority=100,in_port={y},actions=output:{x}")
        return True, []

    def _delete(self, aid: str) -> tuple[bool, list[str]]:
        ports = self._ports(aid)
        with self.lock:
            if ports is None or any(p not in self.patches for p in ports):
                return False, ["IENE", f"no cross-connect at {aid!r}"]
            for p in ports:
                q = self.patches.pop(p, None)
                if q is not None:
                    self.patches.pop(q, None)
                    for x in (p, q):
                        self._mirror("del-flows", "--strict", self.bridge, f"priority=100,in_port={x}")
        return True, []

    def respond(self, ctag: str, ok: bool, lines: list[str]) -> bytes:
        stamp = time.strftime("%y-%m-%d %H:%M:%S")
        body = "".join(f'   "{line}"\r\n' for line in lines)
        return f"\r\n\n   {self.name} {stamp}\r\nM  {ctag} {'COMPLD' if ok else 'DENY'}\r\n{body};".encode()


class _Handler(socketserver.StreamRequestHandler):
    def setup(self):
        super().setup()
        self.server.sessions.add(self.request)

    def finish(self):
        self.server.sessions.discard(self.request)
        super().finish()

    def handle(self):
        device: Tl1Ocs = self.server.device
        session: dict = {}
        buf = b""
        while True:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            buf += chunk
            while b";" in buf:
                raw, buf = buf.split(b";", 1)
                parts = raw.decode(errors="replace").strip().split(":")
                verb = parts[0].upper()
                aid = parts[2] if len(parts) > 2 else ""
                ctag = parts[3] if len(parts) > 3 and parts[3] else "0"
                params = parts[5] if len(parts) > 5 else ""
                ok, lines = device.handle(verb, aid, params, session)
                self.request.sendall(device.respond(ctag, ok, lines))


class Tl1Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, device: Tl1Ocs, host: str = "127.0.0.1", port: int = DEFAULT_PORT):
        self.device = device
        self.sessions: set[socket.socket] = set()  # open TL1 sessions, so that a power cut can drop them
        super().__init__((host, port), _Handler)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, daemon=True)
        t.start()
        return t

    def power_off(self) -> None:
        """Like pulling the plug: stop listening and drop every session (peers see the connection reset)."""
        self.shutdown()
        self.server_close()
        for sock in list(self.sessions):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m emulation.tl1_ocs", description=__doc__)
    p.add_argument("--listen", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default %(default)s)")
    p.add_argument("--ports", type=int, default=320, help="port count of the switch (default %(default)s)")
    p.add_argument(
        "--switching-ms", type=float, default=25.0, help="time to make a cross-connect (default %(default)s)"
    )
    p.add_argument("--user", default="admin")
    p.add_argument("--password", default="root")
    p.add_argument("--bridge", help="mirror cross-connects onto this OVS bridge as flows")
    args = p.parse_args(argv)
    server = Tl1Server(
        Tl1Ocs(args.ports, args.switching_ms, args.user, args.password, args.bridge), args.listen, args.port
    )
    print(f"TL1 OCS on {args.listen}:{args.port}, {args.ports} ports, {args.switching_ms:g} ms switching", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

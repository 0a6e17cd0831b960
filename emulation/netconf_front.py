"""The emulated NETCONF OCS's front socket: every session (sshd's netconf-subsystem, the agent, a tcp-ncx client)
reaches netconfd through it, so that netconfd reads a session's <hello> apart from what follows it.

Debian's netconfd (yuma123 2.13) mishandles bytes that come in the same read as the end of a session's first
messages: when a message framed with ``]]>]]>`` ends before the session has a protocol (yuma's <ncx-connect>, then
the client's <hello>), the rest of that read is put aside to be handled once the message before it is, but the
loop that should come back to it never does (it has already dropped its session pointer), so the put-aside bytes
wait until the client sends more. A client that sends its first RPC right behind its <hello> (ncclient does: the
session is open once both hellos are sent) and netconfd busy for a moment: both land in one read, and that RPC is
never answered. The front passes each session's first two messages on one at a time, the next only once netconfd
has read the one before (the socket's send queue empty, SIOCOUTQ), and after them copies bytes both ways as they
come. A lab's switch needs none of this: the front is part of the emulated switch, not of the driver.

`python -m emulation.netconf_front --listen SOCK --netconfd SOCK [--port PORT]` serves until SIGTERM; it binds
under a temporary name and renames it to SOCK once it listens, so SOCK existing means it accepts.
"""
from __future__ import annotations

import argparse
import array
import fcntl
import os
import socket
import termios
import threading
import time
from pathlib import Path

EOM = b"]]>]]>"  # the end of a message framed as NETCONF 1.0 does (every <hello>, and yuma's <ncx-connect>)
ONE_AT_A_TIME = 2  # <ncx-connect>, then the client's <hello>


def unread(sock: socket.socket) -> int:
    """Bytes sent on a Unix stream socket that its peer has not read yet (SIOCOUTQ, the same number as TIOCOUTQ)."""
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, count)
    return count[0]


class Session:
    """One client's connection and its own connection to netconfd."""

    def __init__(self, client: socket.socket, server: socket.socket):
        self.client, self.server = client, server
        self.ended = threading.Event()

    def run(self) -> None:
        threading.Thread(target=self._down, daemon=True).start()
        self._up()

    def _up(self) -> None:
        """Client to netconfd: the first messages one at a time, each once netconfd has read the one before."""
        left, buf = ONE_AT_A_TIME, b""
        try:
            while not self.ended.is_set():
                data = self.client.recv(65536)
                if not data:
                    break
                buf += data
                while left and (end := buf.find(EOM)) >= 0:
                    message, buf = buf[:end + len(EOM)], buf[end + len(EOM):]
                    self.server.sendall(message)
                    left -= 1
                    while unread(self.server) and not self.ended.is_set():
                        time.sleep(0.0005)
                if not left and buf:
                    self.server.sendall(buf)
                    buf = b""
        except OSError:
            pass
        self.end()

    def _down(self) -> None:
        try:
            while data := self.server.recv(65536):
                self.client.sendall(data)
        except OSError:
            pass
        self.end()

    def end(self) -> None:
        """Either side closed: close both (netconfd ends the session on its end of file, the client sees its own)."""
        if self.ended.is_set():
            return
        self.ended.set()
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(listener: socket.socket, netconfd: Path) -> None:
    while True:
        client, _ = listener.accept()
        if client.family == socket.AF_INET:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each reply goes at once
        threading.Thread(target=_session, args=(client, netconfd), daemon=True).start()


def _session(client: socket.socket, netconfd: Path) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.connect(str(netconfd))  # (it waits while netconfd's backlog is full, as a client of netconfd's would)
        Session(client, server).run()
    except OSError:  # netconfd is down: the client sees its connection end, as it would without the front
        pass
    finally:
        client.close()
        server.close()


def listen_unix(path: Path) -> socket.socket:
    """A listening socket at `path`, which appears only once it listens."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp))
    os.chmod(tmp, 0o777)  # sshd's netconf-subsystem runs as the SSH user
    sock.listen(16)
    os.replace(tmp, path)
    return sock


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m emulation.netconf_front", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", type=Path, required=True, help="the socket clients reach netconfd at")
    p.add_argument("--netconfd", type=Path, required=True, help="netconfd's own socket (its --ncxserver-sockname)")
    p.add_argument("--port", type=int, default=0, help="also listen on 127.0.0.1:PORT (tcp-ncx clients)")
    args = p.parse_args(argv)
    if args.port:  # before the socket appears: its being there says both listen
        tcp = socket.socket()
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(("127.0.0.1", args.port))
        tcp.listen(16)
        threading.Thread(target=_serve, args=(tcp, args.netconfd), daemon=True).start()
    _serve(listen_unix(args.listen), args.netconfd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""NETCONF sessions: over SSH (RFC 6242, the way a lab's switch is reached: port 830, its host key checked against a
known_hosts file, a key or a password), or over yuma123 netconfd's direct TCP port (``tcp-ncx``: no authentication,
the emulated OCS on loopback only). Both on ncclient (Debian's `python3-ncclient`, imported when a session opens: it
pulls in paramiko); both send each message at once.

Whatever stops a session from opening is an error naming the address and what to do about it: `LoginRefused` for a
host key that is not the known one (never accepted) and for a refused user or key, `OcsUnavailable` for a closed
port or a server that does not answer.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
from dataclasses import dataclass

from controller.core.errors import OcsUnavailable
from controller.drivers.errors import LoginRefused

SSH_PORT = 830
_NCX_MAGIC = "x56o8937ab17eg922z34rwhobskdbyswfehkpsqq3i55a0an960ccw24a4ek864aOpal1t2p"


@dataclass(frozen=True)
class Address:
    transport: str  # "ssh" or "tcp-ncx"
    host: str  # tcp-ncx with port 0: the path of netconfd's own socket (the emulation's agent; no rack file names it)
    port: int
    user: str | None = None  # ssh: the login, if the address names one (else the controller's option)
    known_hosts: str | None = None  # ssh: the file the host key must be in (None: the user's ~/.ssh/known_hosts)
    keyfile: str | None = None  # ssh: the private key to log in with, if the address names one

    def __str__(self) -> str:
        return f"{self.transport}://{self.host}:{self.port}"


FORMS = "host[:port], ssh://[user@]host[:port][?known_hosts=FILE&keyfile=FILE] (SSH, port 830) or tcp-ncx://host:port"


def parse_address(address: str | None) -> Address:
    """The rack file's ``address`` (one of FORMS); ValueError names what is wrong."""
    text = (address or "").strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "ssh", text
    if scheme not in ("ssh", "tcp-ncx"):
        raise ValueError(f"unknown NETCONF transport {scheme!r} in {address!r} (ssh:// or tcp-ncx://)")
    rest, _, query = rest.partition("?")
    files: dict[str, str] = {}
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key not in ("known_hosts", "keyfile") or scheme != "ssh" or key in files:
            raise ValueError(f"bad NETCONF address {address!r}: ssh:// takes ?known_hosts=FILE&keyfile=FILE, no "
                             f"{key!r}")
        if not value.startswith("/"):
            raise ValueError(f"bad NETCONF address {address!r}: {key} takes an absolute path, not {value!r}")
        files[key] = value
    user, at, rest = rest.rpartition("@")
    if at and (scheme != "ssh" or not user):
        raise ValueError(f"bad NETCONF address {address!r}: a user (USER@) only in ssh://USER@host")
    host, _, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
    if not host or (scheme == "tcp-ncx" and not port) or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"bad NETCONF address {address!r}: {FORMS}")
    return Address(scheme, host, int(port) if port else SSH_PORT, user or None, files.get("known_hosts"),
                   files.get("keyfile"))


def _no_delay(sock) -> None:
    """Each message's last TCP segment goes at once (TCP_NODELAY). Without it, an RPC longer than one SSH packet (an
    edit-config of hundreds of pairs: paramiko sends packets of 32 KiB) has its last segment held back by Nagle's
    algorithm until the server acknowledges the one before, which the server's delayed ACK puts off by ~40 ms."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _sessions():
    """ncclient's SSH session, and one over yuma123's direct TCP port; both send a message at once (ncclient's own
    loop sends only when it next wakes, every 0.1 s), on a TCP socket without Nagle's delay (`_no_delay`)."""
    from ncclient.transport.session import NetconfBase
    from ncclient.transport.ssh import END_DELIM, MSG_DELIM, SSHSession

    class Direct(SSHSession):
        hello_wait = 30.0  # seconds for the server's <hello>

        def _post_connect(self, *args, **kwargs):
            # Our <hello> once the server's is here, within the session's timeout (ncclient alone would wait 60 s
            # for it after sending ours). The server's stays in the channel for ncclient's loop to read.
            if not select.select([self._channel], [], [], self.hello_wait)[0]:
                raise TimeoutError(f"no <hello> from the server within {self.hello_wait:g} s")
            super()._post_connect(*args, **kwargs)

        def send(self, message):
            data = message.encode()
            if self._base == NetconfBase.BASE_11:
                data = b"\n#%d\n%s%s" % (len(data), data, END_DELIM)
            else:
                data += MSG_DELIM
            with self._sending:
                self._channel.sendall(data)

    class Channel:  # what ncclient's loop uses of a paramiko channel, on a socket
        def __init__(self, sock: socket.socket):
            self.sock = sock

        def fileno(self):
            return self.sock.fileno()

        def recv(self, n):
            return self.sock.recv(n)

        def send(self, data):
            return self.sock.send(data)

        def sendall(self, data):
            self.sock.sendall(data)

        def send_ready(self):
            return True

        def get_name(self):
            return "tcp-ncx"

        def close(self):
            self.sock.close()

    class Ending:  # what ncclient's close uses of a paramiko transport: shutting the socket ends its loop's recv
        def __init__(self, sock: socket.socket):
            self.sock = sock

        def is_active(self):
            return self.sock.fileno() >= 0

        def close(self):
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    class TcpNcx(Direct):
        """yuma123's netconfd on its --tcp-direct-port: an <ncx-connect> naming the user (and the SSH port netconfd
        allows, as its own SSH subsystem does), then plain NETCONF."""

        def connect(self, host, port, username, timeout):
            if port == 0:  # netconfd's own socket (`host` is its path), as its netconf-subsystem reaches it
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(host)
                host = "127.0.0.1"
            else:
                sock = socket.create_connection((host, port), timeout=timeout)
                _no_delay(sock)
            sock.settimeout(None)
            sock.sendall(b'<?xml version="1.0" encoding="UTF-8"?>\n<ncx-connect xmlns="http://netconfcentral.org/ns/'
                         b'yuma-ncx" version="1" user="%s" address="%s" magic="%s" transport="ssh" port="%d" />\n%s'
                         % (username.encode(), host.encode(), _NCX_MAGIC.encode(), SSH_PORT, MSG_DELIM))
            self.hello_wait = timeout  # netconfd's <hello> comes once it has taken the <ncx-connect>: ours after it
            self._host, self._channel, self._transport = host, Channel(sock), Ending(sock)
            self._connected = True
            self._post_connect()
            self.parser = self._device_handler.get_xml_parser(self)

    return Direct, TcpNcx



def connect(address: Address, user: str, password: str = "", key: str = "", timeout: float = 30.0):
    """A ncclient Manager on a new session to `address` (as `parse_address` makes it), as `user`, with `key` (a
    private key file) or `password`. Raises LoginRefused or OcsUnavailable, naming the address."""
    logging.getLogger("ncclient").setLevel(logging.WARNING)  # it logs every RPC at INFO
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    from ncclient.devices.default import DefaultDeviceHandler
    from ncclient.manager import Manager
    from ncclient.transport.errors import AuthenticationError, SSHUnknownHostError

    direct, tcp_ncx = _sessions()
    handler = DefaultDeviceHandler()
    session = (tcp_ncx if address.transport == "tcp-ncx" else direct)(handler)
    session._sending, session.hello_wait = threading.Lock(), timeout
    known = address.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
    try:
        if address.transport == "tcp-ncx":
            session.connect(address.host, address.port, user, timeout)
        else:
            if not os.path.isfile(known):
                raise LoginRefused(f"no known_hosts file {known} to check the host key of {address} against")
            session.load_known_hosts(known)
            session.connect(address.host, address.port, timeout=timeout, unknown_host_cb=lambda *_: False,
                            username=user, password=password or None, key_filename=key or None,
                            allow_agent=False, look_for_keys=False, hostkey_verify=True)
            _no_delay(session.transport.sock)
    except BaseException as e:
        if session.transport is not None:
            session.close()
        if isinstance(e, SSHUnknownHostError):
            raise LoginRefused(f"the SSH host key of {address} (fingerprint {e.fingerprint}) is not the one {known} "
                               "holds for it: refused (if the switch's key was changed on purpose, put the new one "
                               "there)") from None
        if isinstance(e, AuthenticationError):
            how = f"key {key}" if key else "its password"
            raise LoginRefused(f"{address} refused user {user!r} with {how}") from None
        if isinstance(e, (LoginRefused, OcsUnavailable)):
            raise
        if isinstance(e, Exception):
            raise OcsUnavailable(f"cannot reach NETCONF at {address}: {type(e).__name__}: {e}") from None
        raise
    return Manager(session, handler, timeout=timeout)

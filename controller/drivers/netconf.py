"""NETCONF driver for MEMS switches that serve their cross-connects in a YANG model (Polatis style).

The model is `yang/optirack-ocs.yang` beside this file: ``/cross-connects/pair`` keyed by ``ingress``, with an
``egress``; the circuit ``(a, b)`` (``a < b``) is the pair ingress a, egress b. A change is one edit-config of the
candidate datastore and one commit, with the candidate locked: the device makes every pair of it or none. After the
commit the driver reads the running datastore back and checks the change is there. Sessions are NETCONF over SSH
(RFC 6242, port 830: ``address: host[:port]`` or ``ssh://host[:port]``; the host key must be in the controller's
``~/.ssh/known_hosts``), or yuma123 netconfd's direct TCP port (``tcp-ncx://host:port``, the emulated OCS on
loopback: no authentication, so never across a network).

Errors: an ``rpc-error`` (a refused edit or commit, the candidate locked by another session) is a NetconfError
naming the operation and the port; a reply that does not parse, a lost session and a timeout leave the device's
state unknown: the session is dropped and OcsUnavailable raised, so that the OCS app resynchronises the device.
ncclient is imported when a session opens (it pulls in paramiko).
"""
from __future__ import annotations

import logging
import re
import select
import socket
import threading
from pathlib import Path
from xml.etree import ElementTree as ET

from controller.core.errors import DeviceError
from controller.drivers.ocs import ApplyResult, OcsDriver, OcsUnavailable, Pair

NS = "urn:optirack:yang:optirack-ocs"
YANG = Path(__file__).parent / "yang" / "optirack-ocs.yang"
SSH_PORT = 830
_NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
FILTER = f'<cross-connects xmlns="{NS}"/>'
_INGRESS_IN_PATH = re.compile(r"ingress\s*=\s*['\"]?(\d+)")
_NCX_MAGIC = "x56o8937ab17eg922z34rwhobskdbyswfehkpsqq3i55a0an960ccw24a4ek864aOpal1t2p"


class NetconfError(DeviceError):
    """The device answered and refused (an rpc-error); what it holds is what it held before."""


class MalformedReply(DeviceError):
    pass


def parse_address(address: str | None) -> tuple[str, str, int]:
    """(transport, host, port) of the rack file's ``address``; ValueError names what is wrong."""
    text = (address or "").strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "ssh", text
    if scheme not in ("ssh", "tcp-ncx"):
        raise ValueError(f"unknown NETCONF transport {scheme!r} in {address!r} (ssh:// or tcp-ncx://)")
    host, _, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
    if not host or (scheme == "tcp-ncx" and not port) or (port and not port.isdigit()):
        raise ValueError(f"bad NETCONF address {address!r}: host[:port], ssh://host[:port] or tcp-ncx://host:port")
    return scheme, host, int(port) if port else SSH_PORT


def edit_config(remove: set[Pair], add: set[Pair]) -> str:
    """The <config> of one edit-config (default-operation none) that deletes `remove` and makes `add`: a pair whose
    ingress is both removed and added is replaced in place."""
    new = {a: b for a, b in add}
    lines = [f'<config><cross-connects xmlns="{NS}" xmlns:nc="{_NC}" nc:operation="merge">']
    for a, _ in sorted(remove):
        if a not in new:
            lines.append(f'<pair nc:operation="delete"><ingress>{a}</ingress></pair>')
    replaced = {a for a, _ in remove}
    for a, b in sorted(add):
        op = "replace" if a in replaced else "create"
        lines.append(f'<pair nc:operation="{op}"><ingress>{a}</ingress><egress>{b}</egress></pair>')
    lines.append("</cross-connects></config>")
    return "".join(lines)


def parse_pairs(data_xml: str) -> set[Pair]:
    """The circuits in a get-config reply's <data>; MalformedReply says what is wrong with it."""
    try:
        root = ET.fromstring(data_xml)
    except ET.ParseError as e:
        raise MalformedReply(f"the reply is not XML ({e})") from None
    found = set()
    for pair in root.iter(f"{{{NS}}}pair"):
        ingress, egress = pair.findtext(f"{{{NS}}}ingress"), pair.findtext(f"{{{NS}}}egress")
        try:
            a, b = int(ingress), int(egress)
        except (TypeError, ValueError):
            raise MalformedReply(f"a pair without port numbers (ingress {ingress!r}, egress {egress!r})") from None
        if a < 1 or b < 1 or a == b:
            raise MalformedReply(f"a pair with impossible ports (ingress {a}, egress {b})")
        found.add((min(a, b), max(a, b)))
    return found


def _ports(pairs: set[Pair], most: int = 6) -> str:
    ports = sorted({p for pair in pairs for p in pair})
    shown = ", ".join(map(str, ports[:most]))
    return f"port{'s' if len(ports) > 1 else ''} {shown}{f' and {len(ports) - most} more' if len(ports) > most else ''}"


def _refusal(error, ports: str) -> str:
    """What an rpc-error says, with the port of its error-path (else the change's ports); several errors: each."""
    parts = []
    for e in getattr(error, "errors", None) or [error]:
        tag, path = getattr(e, "_tag", None), getattr(e, "_path", None) or ""
        message = (getattr(e, "_message", None) or "").strip() or str(e).strip()
        m = _INGRESS_IN_PATH.search(path)
        where = f"port {m.group(1)}" if m else ports
        if tag == "lock-denied":
            message = f"the candidate datastore is locked by another session ({message})"
        parts.append(f"{where} refused: {tag + ': ' if tag else ''}{message}")
    return "; ".join(dict.fromkeys(parts))


def _sessions():
    """ncclient's SSH session, and one over yuma123's direct TCP port; both send a message at once (ncclient's own
    loop sends only when it next wakes, every 0.1 s)."""
    from ncclient.transport.session import NetconfBase
    from ncclient.transport.ssh import END_DELIM, MSG_DELIM, SSHSession

    class Direct(SSHSession):
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
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.settimeout(None)
            sock.sendall(b'<?xml version="1.0" encoding="UTF-8"?>\n<ncx-connect xmlns="http://netconfcentral.org/ns/'
                         b'yuma-ncx" version="1" user="%s" address="%s" magic="%s" transport="ssh" port="%d" />\n%s'
                         % (username.encode(), host.encode(), _NCX_MAGIC.encode(), SSH_PORT, MSG_DELIM))
            # Our <hello> only once the server's is here: netconfd sends its own when it has taken the
            # <ncx-connect>, and drops a client <hello> that comes before that (the session then never answers).
            if not select.select([sock], [], [], timeout)[0]:
                sock.close()
                raise TimeoutError(f"no <hello> from {host}:{port} within {timeout:g} s")
            self._host, self._channel, self._transport = host, Channel(sock), Ending(sock)
            self._connected = True
            self._post_connect()
            self.parser = self._device_handler.get_xml_parser(self)

    return Direct, TcpNcx


def connect(transport: str, host: str, port: int, user: str, password: str, timeout: float):
    """A ncclient Manager on a new session."""
    logging.getLogger("ncclient").setLevel(logging.WARNING)  # it logs every RPC at INFO
    from ncclient.devices.default import DefaultDeviceHandler
    from ncclient.manager import Manager

    direct, tcp_ncx = _sessions()
    handler = DefaultDeviceHandler()
    session = (tcp_ncx if transport == "tcp-ncx" else direct)(handler)
    session._sending = threading.Lock()
    try:
        if transport == "tcp-ncx":
            session.connect(host, port, user, timeout)
        else:
            session.load_known_hosts()
            session.connect(host, port, user, password, timeout=timeout, allow_agent=False, look_for_keys=False)
    except BaseException:
        if session.transport is not None:
            session.close()
        raise
    return Manager(session, handler, timeout=timeout)


class NetconfOcs(OcsDriver):
    """A NETCONF OCS; `spec.address` as in `parse_address`, credentials from the controller's options."""

    def __init__(self, spec, user: str, password: str, timeout: float = 30.0, lock=None, connector=connect, **kw):
        super().__init__(spec, **kw)
        try:
            self.transport, self.host, self.port = parse_address(spec.address)
        except ValueError as e:
            raise ValueError(f"OCS {spec.name}: {e}") from None
        self.user, self.password, self.timeout, self.connector = user, password, timeout, connector
        self.manager = None
        self._exchange = lock if lock is not None else threading.Lock()  # one operation of ours at a time

    @property
    def connected(self) -> bool:
        return self.manager is not None and self.manager.connected

    def _session(self):
        if not self.connected:
            try:
                self.manager = self.connector(self.transport, self.host, self.port, self.user, self.password,
                                              self.timeout)
            except Exception as e:  # noqa: BLE001 (ncclient raises its own, socket and paramiko errors: all mean unreachable)
                self._lost(f"cannot reach NETCONF at {self.spec.address}: {type(e).__name__}: {e}")
        return self.manager

    def _lost(self, why: str):
        manager, self.manager = self.manager, None
        if manager is not None:
            try:
                manager.close_session() if manager.connected else None
            except Exception:  # noqa: BLE001 (it is being dropped)
                pass
        self.last_error = why
        raise OcsUnavailable(f"OCS {self.spec.name}: {why}") from None

    def _call(self, operation: str, ports: str, fn, *args, **kwargs):
        """One RPC; its errors become the driver's, naming `operation` and the port (from the error's path, else
        `ports`)."""
        from ncclient.operations import RPCError, TimeoutExpiredError
        from ncclient.transport import TransportError

        try:
            reply = fn(*args, **kwargs)
        except RPCError as e:
            raise NetconfError(f"OCS {self.spec.name}: {operation} ({_refusal(e, ports)})") from None
        except TimeoutExpiredError:
            self._lost(f"no answer to {operation} ({ports}) within {self.timeout:g} s")
        except (TransportError, OSError, EOFError) as e:
            self._lost(f"NETCONF session lost during {operation} ({ports}): {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 (ncclient's parser fails on a broken reply with whatever it raises)
            self._lost(f"malformed reply to {operation} ({ports}): {type(e).__name__}: {e}")
        self.seen()
        return reply

    def _read(self, operation: str = "get-config", ports: str = "every port", ingress=None) -> set[Pair]:
        """The running datastore's pairs (only those with these ingress ports, if given: a subtree filter by key)."""
        where = FILTER if ingress is None else (f'<cross-connects xmlns="{NS}">' + "".join(
            f"<pair><ingress>{a}</ingress></pair>" for a in sorted(ingress)) + "</cross-connects>")
        reply = self._call(operation, ports, self._session().get_config, source="running", filter=("subtree", where))
        try:
            return parse_pairs(reply.data_xml)
        except MalformedReply as e:
            self._lost(f"malformed reply to {operation} ({ports}): {e}")

    def read(self) -> set[Pair]:
        with self._exchange:
            return self._read()

    def apply(self, remove: set[Pair], add: set[Pair], on_dark=None) -> ApplyResult:
        with self._exchange:
            ports = _ports(remove | add)
            m = self._session()
            self._call("lock of the candidate datastore", ports, m.lock, target="candidate")
            try:
                try:
                    self._call("edit-config", ports, m.edit_config, target="candidate",
                               config=edit_config(remove, add), default_operation="none")
                    dark_start = self.clock()  # the commit: old pairs go, mirrors move, new pairs are made
                    if on_dark is not None:
                        on_dark()
                    self._call("commit", ports, m.commit)
                except NetconfError:
                    self._quietly(m.discard_changes)
                    raise
            finally:
                self._quietly(m.unlock, target="candidate")
            switching = self.switching_time_s(len(add))
            self.sleep(max(0.0, switching - (self.clock() - dark_start)))  # what the device promises
            have = self._read("read-back after commit", ports, ingress={a for a, _ in remove | add})
            wrong = have ^ add  # the changed ingress ports hold exactly the new pairs
            if wrong:
                raise NetconfError(f"OCS {self.spec.name}: after the commit the device holds other cross-connects "
                                   f"at {_ports(wrong)} than were committed")
            return ApplyResult(dark_start, self.clock() if add else None, switching)

    def _quietly(self, fn, **kwargs) -> None:
        if not self.connected:
            return
        try:
            fn(**kwargs)
        except Exception:  # noqa: BLE001 (cleaning up after an error that is already being raised)
            pass

    def replace(self, circuits: set[Pair]) -> None:
        current = self.read()
        if current != circuits:
            self.apply(current - circuits, circuits - current)

    def close(self) -> None:
        with self._exchange:
            if self.connected:
                self._quietly(self.manager.close_session)
            self.manager = None

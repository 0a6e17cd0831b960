"""NETCONF driver for MEMS switches that serve their cross-connects in a YANG model (Polatis style).

The model is `yang/optirack-ocs.yang` beside this file: ``/cross-connects/pair`` keyed by ``ingress``, with an
``egress``; the circuit ``(a, b)`` (``a < b``) is the pair ingress a, egress b. A change is, with the candidate
datastore locked, one edit-config and one commit: the device makes every pair of it or none. Where the device offers
``:confirmed-commit`` (RFC 6241), the commit is a confirmed one: the device undoes it by itself unless it is confirmed
within `confirm_timeout`, or at once if our session ends first; the driver reads the change back, and `confirm` (a
second commit, then the unlock) keeps it, called by the change once every OCS of it has read its change back.
Without the capability: commit, unlock, read-back. The RPCs of one change are lock, edit-config, commit, get-config,
commit (the confirm) and unlock, and no others; each one's round trip is logged (`rpc_ms`) for the benchmark.

Sessions (SSH with the host key checked, or yuma123's direct TCP port) are `netconf_transport`'s. Errors: an
``rpc-error`` (a refused edit or commit, the candidate locked by another session) is a NetconfError naming the
operation and the port; a reply that does not parse, a lost session and a timeout leave the device's state unknown:
the session is dropped (an unconfirmed change with it, by the device) and OcsUnavailable raised, so that the OCS app
resynchronises the device.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn
from xml.etree import ElementTree as ET

from controller.core.errors import OcsUnavailable
from controller.drivers.errors import MalformedReply, NetconfError
from controller.drivers.netconf_transport import FORMS, Address, connect, parse_address
from controller.drivers.ocs import ApplyResult, OcsDriver, Pair
from controller.drivers.registry import DriverKind, Setting

LOG = logging.getLogger("optirack.netconf")
NS = "urn:optirack:yang:optirack-ocs"
YANG = Path(__file__).parent / "yang" / "optirack-ocs.yang"
_NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
FILTER = f'<cross-connects xmlns="{NS}"/>'
_INGRESS_IN_PATH = re.compile(r"ingress\s*=\s*['\"]?(\d+)")
CONFIRMED = ":confirmed-commit"
VALIDATE = ":validate"  # the device takes an edit's test-option (RFC 6241 8.6): `apply` asks it for "set"
BY_KEY_MOST = 32  # a read-back of more changed ports reads the whole container (`_read`)


def edit_config(remove: set[Pair], add: set[Pair]) -> str:
    """The <config> of one edit-config (default-operation none) that deletes `remove` and makes `add`: a pair whose
    ingress is both removed and added keeps its entry and gets its new egress (merged: the server changes one leaf
    rather than replacing the entry, which costs netconfd less at the edit and at the commit)."""
    new = {a: b for a, b in add}
    lines = [f'<config><cross-connects xmlns="{NS}" xmlns:nc="{_NC}" nc:operation="merge">']
    for a, _ in sorted(remove):
        if a not in new:
            lines.append(f'<pair nc:operation="delete"><ingress>{a}</ingress></pair>')
    kept = {a for a, _ in remove}
    for a, b in sorted(add):
        op = "" if a in kept else ' nc:operation="create"'
        lines.append(f'<pair{op}><ingress>{a}</ingress><egress>{b}</egress></pair>')
    lines.append("</cross-connects></config>")
    return "".join(lines)


def parse_pairs(data: Any) -> set[Pair]:
    """The circuits in a get-config reply's <data> (its text, or the element ncclient parsed it into); MalformedReply
    says what is wrong with it."""
    try:
        root = ET.fromstring(data) if isinstance(data, str) else data
    except ET.ParseError as e:
        raise MalformedReply(f"the reply is not XML ({e})") from None
    found = set()
    for pair in root.iter(f"{{{NS}}}pair"):
        ingress, egress = pair.findtext(f"{{{NS}}}ingress"), pair.findtext(f"{{{NS}}}egress")
        try:
            a, b = int(ingress or ""), int(egress or "")
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


class NetconfOcs(OcsDriver):
    """A NETCONF OCS; `spec.address` as in `netconf_transport.parse_address`, credentials from the controller's
    options (a private key file, a password, or both: the key is tried first)."""

    def __init__(self, spec, user: str, password: str = "", key: str = "", timeout: float = 30.0,
                 confirm_timeout: float = 10.0, lock=None, connector=connect, **kw):
        super().__init__(spec, **kw)
        try:
            self.address: Address = parse_address(spec.address)
        except ValueError as e:
            raise ValueError(f"OCS {spec.name}: {e}") from None
        # the address's own user and key file (a rack file's), else the controller's options
        self.user, self.key = self.address.user or user, self.address.keyfile or key
        self.password, self.timeout = password, timeout
        self.confirm_timeout, self.connector = max(1, round(confirm_timeout)), connector
        self.manager: Any = None  # ncclient's Manager while a session is open
        self.confirmed = False  # the device offers :confirmed-commit (known once a session is open)
        self.validates = False  # the device offers :validate, so an edit-config may skip its whole-datastore check
        self._pending: str | None = None  # the ports of a change the device undoes unless confirmed
        self.rpc_ms: dict[str, float] = {}  # the last change: each RPC's round trip, the switching wait, the whole
        self._exchange = lock if lock is not None else threading.Lock()  # one operation of ours at a time

    @property
    def connected(self) -> bool:
        return self.manager is not None and self.manager.connected

    def _session(self):
        if not self.connected:
            self._pending = None  # a session that ended took its unconfirmed change with it
            try:
                self.manager = self.connector(self.address, self.user, self.password, self.key, self.timeout)
            except OcsUnavailable as e:  # LoginRefused is one: its kind is kept
                self._lost(str(e), type(e))
            except Exception as e:  # noqa: BLE001 (a connector's own failure: the device is unreachable)
                self._lost(f"cannot reach NETCONF at {self.address}: {type(e).__name__}: {e}")
            caps = self.manager.server_capabilities
            self.confirmed, self.validates = CONFIRMED in caps, VALIDATE in caps
        return self.manager

    def _lost(self, why: str, kind: type[OcsUnavailable] = OcsUnavailable) -> NoReturn:
        manager, self.manager, self._pending = self.manager, None, None
        if manager is not None:
            try:
                manager.close_session() if manager.connected else None
            except Exception:  # noqa: BLE001 (it is being dropped)
                pass
        self.last_error = why
        raise kind(f"OCS {self.spec.name}: {why}") from None

    @contextmanager
    def _errors(self, operation: str, ports: str):
        """ncclient's errors as the driver's, naming `operation` and the port (from the error's path, else `ports`)."""
        from ncclient.operations import RPCError, TimeoutExpiredError
        from ncclient.transport import TransportError

        try:
            yield
        except RPCError as e:
            raise NetconfError(f"OCS {self.spec.name}: {operation} ({_refusal(e, ports)})") from None
        except TimeoutExpiredError:
            self._lost(f"no answer to {operation} ({ports}) within {self.timeout:g} s")
        except (TransportError, OSError, EOFError) as e:
            self._lost(f"NETCONF session lost during {operation} ({ports}): {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 (ncclient's parser fails on a broken reply with whatever it raises)
            self._lost(f"malformed reply to {operation} ({ports}): {type(e).__name__}: {e}")

    def _call(self, rpc: str, operation: str, ports: str, fn, *args, **kwargs):
        """One RPC (`rpc`: its name in `rpc_ms`), its reply waited for; errors as `_errors` makes them."""
        t0 = time.perf_counter()
        with self._errors(operation, ports):
            reply = fn(*args, **kwargs)
        self.rpc_ms[rpc] = 1000 * (time.perf_counter() - t0)
        self.seen()
        return reply

    def _send(self, m, operation: str, ports: str, *calls: tuple[str, dict]) -> list:
        """RPCs (the Manager's method, its arguments) sent back to back, their replies not waited for (a NETCONF server
        answers in order): only for RPCs none of which decides whether the next may go. `_reply` waits for each."""
        with self._errors(operation, ports):
            m.async_mode = True
            try:
                return [getattr(m, name)(**kwargs) for name, kwargs in calls]
            finally:
                m.async_mode = False

    def _reply(self, rpc: str, operation: str, ports: str, sent, since: float):
        """The reply to an RPC `_send` sent, as `_call` would return it; its time in `rpc_ms` counts from `since`."""
        from ncclient.operations import RPCError, TimeoutExpiredError
        from ncclient.xml_ import to_ele

        with self._errors(operation, ports):
            if not sent.event.wait(self.timeout):
                raise TimeoutExpiredError(f"no reply within {self.timeout:g} s")
            if sent.error is not None:
                raise sent.error
            reply = sent.reply
            reply.parse()
            if reply.error is not None:
                errors = reply.errors
                raise RPCError(to_ele(reply.xml), errs=errors) if len(errors) > 1 else reply.error
        self.rpc_ms[rpc] = 1000 * (time.perf_counter() - since)
        self.seen()
        return reply

    @staticmethod
    def _where(ingress=None) -> dict:
        """The get-config of the running datastore's pairs (only those with these ingress ports, if given). A few ports
        are asked for by key (a subtree filter); more, and the whole container is read and picked here: netconfd
        matches a filter's keys one by one against its pairs, which for hundreds of keys costs it more than sending
        them all."""
        by_key = ingress is not None and len(ingress) <= BY_KEY_MOST
        where = FILTER if not by_key else (f'<cross-connects xmlns="{NS}">' + "".join(
            f"<pair><ingress>{a}</ingress></pair>" for a in sorted(ingress)) + "</cross-connects>")
        return {"source": "running", "filter": ("subtree", where)}

    def _pairs(self, reply, operation: str, ports: str, ingress=None) -> set[Pair]:
        try:
            pairs = parse_pairs(reply.data_ele)  # the element ncclient parsed: not written out and parsed again
            return pairs if ingress is None else {p for p in pairs if p[0] in ingress}
        except MalformedReply as e:
            self._lost(f"malformed reply to {operation} ({ports}): {e}")

    def _read(self, operation: str = "get-config", ports: str = "every port", ingress=None) -> set[Pair]:
        m = self._session()
        return self._pairs(self._call("get-config", operation, ports, m.get_config, **self._where(ingress)),
                           operation, ports, ingress)

    def read(self) -> set[Pair]:
        with self._exchange:
            return self._read()

    def apply(self, remove: set[Pair], add: set[Pair], on_dark=None) -> ApplyResult:
        """The change, committed (confirmed, where the device offers it) and read back; unconfirmed, the candidate
        stays locked until `confirm` or `cancel`."""
        with self._exchange:
            if self._pending is not None:
                raise NetconfError(f"OCS {self.spec.name}: the change at {self._pending} is not confirmed yet")
            t0, ports, self.rpc_ms = time.perf_counter(), _ports(remove | add), {}
            changed = {a for a, _ in remove | add}
            m = self._session()
            self._call("lock", "lock of the candidate datastore", ports, m.lock, target="candidate")
            committed, locked = False, True
            try:
                try:
                    # test-option "set": each edited pair is still checked against the model, but not the whole
                    # candidate (every pair against every other), which the commit checks once anyway
                    self._call("edit-config", "edit-config", ports, m.edit_config, target="candidate",
                               config=edit_config(remove, add), default_operation="none",
                               test_option="set" if self.validates else None)
                    dark_start = self.clock()  # the commit: old pairs go, mirrors move, new pairs are made
                    if on_dark is not None:
                        on_dark()
                    readback = None
                    if self.confirmed:
                        # the read-back right behind the commit: the server answers it once the commit is done, so
                        # that it reads what the commit made without a round trip between them
                        sent = time.perf_counter()
                        commit, readback = self._send(
                            m, "confirmed commit", ports,
                            ("commit", {"confirmed": True, "timeout": str(self.confirm_timeout)}),
                            ("get_config", self._where(changed)))
                        self._reply("commit", "confirmed commit", ports, commit, sent)
                    else:
                        self._call("commit", "commit", ports, m.commit)
                    committed = True
                except NetconfError:
                    self._quietly(m.discard_changes)
                    raise
                switching = self.switching_time_s(len(add))
                if readback is not None:  # its time counts from the commit's reply
                    self._check(self._pairs(self._reply("get-config", "read-back after commit", ports, readback,
                                                        time.perf_counter()), "read-back after commit", ports, changed),
                                add)
                else:
                    self._unlock(m)
                    locked = False
                wait = max(0.0, switching - (self.clock() - dark_start))
                self.sleep(wait)  # what the device promises
                self.rpc_ms["switching-wait"] = 1000 * wait
                if readback is None:
                    self._check(self._read("read-back after commit", ports, ingress=changed), add)
            except BaseException:
                if committed and self.confirmed:
                    self._quietly(m.cancel_commit)  # the device puts back what it held
                if locked:
                    self._unlock(m)
                raise
            self.rpc_ms["total"] = 1000 * (time.perf_counter() - t0)
            if self.confirmed:
                self._pending = ports
            else:
                LOG.info("OCS %s: NETCONF change (ms) %s", self.spec.name, json.dumps(self.rpc_ms))
            return ApplyResult(dark_start, self.clock() if add else None, switching)

    def _check(self, have: set[Pair], add: set[Pair]) -> None:
        """The changed ingress ports hold exactly the new pairs (`have`: the read-back of them)."""
        wrong = have ^ add
        if wrong:
            raise NetconfError(f"OCS {self.spec.name}: after the commit the device holds other cross-connects at "
                               f"{_ports(wrong)} than were committed")

    def confirm(self) -> None:
        """Keep the change `apply` committed (the confirming commit), then unlock; nothing if none waits."""
        with self._exchange:
            if self._pending is None:
                return
            t0, ports, self._pending = time.perf_counter(), self._pending, None
            # the confirming commit and the unlock back to back: the unlock goes whatever the confirm's outcome
            confirming, unlock = self._send(self.manager, "confirming commit", ports, ("commit", {}),
                                            ("unlock", {"target": "candidate"}))
            try:
                self._reply("confirm", "confirming commit", ports, confirming, t0)
            finally:
                answered = time.perf_counter()
                if self.connected:
                    try:
                        self._reply("unlock", "unlock", ports, unlock, answered)
                    except (NetconfError, OcsUnavailable):  # the change stands (or was undone): nothing to add
                        pass
            self.rpc_ms["total"] += 1000 * (time.perf_counter() - t0)
            LOG.info("OCS %s: NETCONF change (ms) %s", self.spec.name, json.dumps(self.rpc_ms))

    def cancel(self) -> bool:
        """The device undoes the unconfirmed change now: cancel-commit (`:confirmed-commit:1.1`), else by our session's
        end, which undoes it as well."""
        with self._exchange:
            if self._pending is None:
                return False
            self._pending = None
            if self.connected:
                if f"{CONFIRMED}:1.1" in self.manager.server_capabilities:
                    self._quietly(self.manager.cancel_commit)
                    self._unlock(self.manager)
                else:
                    manager, self.manager = self.manager, None
                    self._quietly(manager.close_session)
            return True

    def _unlock(self, m) -> None:
        t0 = time.perf_counter()
        self._quietly(m.unlock, target="candidate")
        self.rpc_ms["unlock"] = 1000 * (time.perf_counter() - t0)

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
            self.confirm()

    def close(self) -> None:
        with self._exchange:
            if self.connected:
                self._quietly(self.manager.close_session)
            self.manager, self._pending = None, None


def _check(spec) -> None:
    """A rack file's entry: its address parses (the error names what is wrong)."""
    parse_address(spec.address)


DRIVER = DriverKind(
    "netconf",
    "switches that serve their cross-connects over NETCONF (Polatis style), over SSH or yuma123's direct TCP port",
    address=FORMS,
    check=_check,
    build=lambda spec, w: NetconfOcs(spec, w.settings["user"], w.settings["password"], w.settings["key"],
                                     confirm_timeout=w.settings["confirm_timeout"], lock=w.lock(), sleep=w.sleep),
    settings=(
        Setting("user", "admin", "login for OCS driven by the netconf driver"),
        Setting("password", "", "password for OCS driven by the netconf driver (SSH)", secret=True),
        Setting("key", "", "private key file for OCS driven by the netconf driver (SSH; tried before the password)"),
        Setting("confirm-timeout", 10.0, "seconds a NETCONF OCS keeps a change before undoing it by itself unless "
                "the controller confirms it (confirmed commit), at least 1"),
    ),
)

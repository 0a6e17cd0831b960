"""OpenFlow 1.3 southbound: flow-mods encoded to bytes, sent in bundles, and confirmed.

Flow-mods are built straight as OpenFlow 1.3 bytes: the same bytes Ryu's message classes make
(tests/unit/test_openflow.py compares them) at a small fraction of the cost, which matters when
a bulk change of 512 circuits and the fabric's re-sync send thousands at once.

`OfRpc.confirm` sends a batch as an ONF bundle (the OpenFlow 1.3 bundle extension, EXT-230,
which Open vSwitch implements): the switch checks every message when it is added and applies
the whole batch at once on commit, all or nothing and several times faster than message by
message. A batch is two round trips, each one write: stage (open, the messages, a barrier:
every message checked) and commit (commit, a barrier). `stage` and `commit` are public so a
caller can stage ahead of time (the OCS stages its new circuits while the mirrors move) and
batches to several switches can overlap. A switch that refuses bundles gets the messages one
by one (remembered per datapath). Statistics requests stay Ryu messages, whose replies Ryu parses.
"""
from __future__ import annotations

import functools
import ipaddress
import itertools
import logging
import struct
from collections.abc import Iterable
from typing import Any

# isort: off
from controller import ryu_compat  # noqa: F401  (before any Ryu import)
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser
# isort: on

from controller.drivers.errors import SwitchError

LOG = logging.getLogger("optirack.openflow")

OCS_COOKIE = 0x0C  # circuits: the cookie's low byte; above it, the flow's in_port (circuit_cookie)
OCS_TAG_MASK = 0xFF
FABRIC_COOKIE = 0x0F  # forwarding
COOKIE_MASK = 0xFFFFFFFFFFFFFFFF
CIRCUIT_PRIORITY = 100
FORWARD_PRIORITY = 100

_HEADER = struct.Struct("!BBHI")  # version, type, length, xid
_FLOW_MOD = struct.Struct(
    "!QQBBHHHIIIH2x"
)  # cookie, mask, table, command, idle, hard, priority, buffer, out port, group, flags
_ONF = 0x4F4E4600  # ONF experimenter id
_BUNDLE = struct.Struct("!IIIHH")  # experimenter, exp_type, bundle id, ctrl type (add: pad), flags
_BUNDLE_FLAGS = 3  # atomic | ordered
_OPEN, _COMMIT, _DISCARD = 0, 4, 6


# --- encoding ---------------------------------------------------------------------------------
def _msg(msg_type: int, body: bytes) -> bytes:
    return _HEADER.pack(ofp.OFP_VERSION, msg_type, _HEADER.size + len(body), 0) + body


def _oxm(field: int, value: bytes) -> bytes:
    return struct.pack("!I", 0x80000000 | field << 9 | len(value)) + value


def _match(*fields: bytes) -> bytes:
    body = b"".join(fields)
    length = 4 + len(body)
    return struct.pack("!HH", ofp.OFPMT_OXM, length) + body + bytes(-length % 8)


def _output(port: int) -> bytes:
    action = struct.pack("!HHIH6x", ofp.OFPAT_OUTPUT, 16, port, ofp.OFPCML_MAX)
    return struct.pack("!HH4x", ofp.OFPIT_APPLY_ACTIONS, 8 + len(action)) + action


def _flow(command: int, cookie: int, priority: int, match: bytes, out_port: int | None = None,
          cookie_mask: int = COOKIE_MASK) -> bytes:
    mask = cookie_mask if command != ofp.OFPFC_ADD else 0
    body = _FLOW_MOD.pack(cookie, mask, 0, command, 0, 0, priority, ofp.OFP_NO_BUFFER, ofp.OFPP_ANY, ofp.OFPG_ANY, 0)
    return _msg(ofp.OFPT_FLOW_MOD, body + match + (b"" if out_port is None else _output(out_port)))


def _in_port(port: int) -> bytes:
    return _match(_oxm(ofp.OFPXMT_OFB_IN_PORT, struct.pack("!I", port)))


def _ip_match(eth_type: int, field: int, ip: str) -> bytes:
    return _match(
        _oxm(ofp.OFPXMT_OFB_ETH_TYPE, struct.pack("!H", eth_type)), _oxm(field, ipaddress.IPv4Address(ip).packed)
    )


def circuit_cookie(in_port: int) -> int:
    """A circuit flow's cookie: the OCS tag, and its in_port above it, so that one delete with a cookie mask removes
    the circuits of an aligned block of ports (`circuit_delete_ports`)."""
    return OCS_COOKIE | in_port << 8


@functools.lru_cache(maxsize=1 << 16)  # a bulk change of 512 circuits sends 2,048; the same ones recur
def circuit_add(in_port: int, out_port: int) -> bytes:
    return _flow(ofp.OFPFC_ADD, circuit_cookie(in_port), CIRCUIT_PRIORITY, _in_port(in_port), out_port)


@functools.lru_cache(maxsize=1 << 14)
def circuit_delete(in_port: int) -> bytes:
    """The circuit flow of one in_port, whatever its cookie (strict: by match and priority)."""
    return _flow(ofp.OFPFC_DELETE_STRICT, OCS_COOKIE, CIRCUIT_PRIORITY, _in_port(in_port), cookie_mask=0)


def port_blocks(ports) -> list[tuple[int, int]]:
    """`ports` as aligned blocks (first port, size: a power of two that divides the first port), each as large as
    it can be from the lowest port up: ports 1-1024 are 11 blocks (1, 2-3, 4-7, … 512-1023, 1024)."""
    todo, blocks, i = sorted(set(ports)), [], 0
    while i < len(todo):
        start, run = todo[i], 1
        while i + run < len(todo) and todo[i + run] == start + run:
            run += 1
        size = (start & -start) if start else 1 << 31
        while size > run:
            size >>= 1
        blocks.append((start, size))
        i += size
    return blocks


@functools.lru_cache(maxsize=1 << 14)
def circuit_delete_block(start: int, size: int) -> bytes:
    """Every circuit flow (with `circuit_add`'s cookie) whose in_port is in the aligned block start … start+size-1,
    in one message: a bulk change of 512 circuits on 1,024 ports deletes in 11 (`port_blocks`), not 1,024."""
    body = _FLOW_MOD.pack(circuit_cookie(start), COOKIE_MASK ^ (size - 1) << 8, 0, ofp.OFPFC_DELETE, 0, 0, 0,
                          ofp.OFP_NO_BUFFER, ofp.OFPP_ANY, ofp.OFPG_ANY, 0)
    return _msg(ofp.OFPT_FLOW_MOD, body + _match())


@functools.lru_cache(maxsize=1 << 16)  # a fabric re-sync sends thousands; the same ones recur
def forward_add(ip: str, out_port: int) -> tuple[bytes, bytes]:
    """Two rules per NIC address: IPv4 to it, and ARP asking for it. An add replaces a rule with the same match."""
    return (
        _flow(ofp.OFPFC_ADD, FABRIC_COOKIE, FORWARD_PRIORITY, _ip_match(0x0800, ofp.OFPXMT_OFB_IPV4_DST, ip), out_port),
        _flow(ofp.OFPFC_ADD, FABRIC_COOKIE, FORWARD_PRIORITY, _ip_match(0x0806, ofp.OFPXMT_OFB_ARP_TPA, ip), out_port),
    )


@functools.lru_cache(maxsize=1 << 14)
def forward_delete(ip: str) -> tuple[bytes, bytes]:
    return (
        _flow(ofp.OFPFC_DELETE_STRICT, FABRIC_COOKIE, FORWARD_PRIORITY, _ip_match(0x0800, ofp.OFPXMT_OFB_IPV4_DST, ip)),
        _flow(ofp.OFPFC_DELETE_STRICT, FABRIC_COOKIE, FORWARD_PRIORITY, _ip_match(0x0806, ofp.OFPXMT_OFB_ARP_TPA, ip)),
    )


def delete_all() -> bytes:
    """Every flow of every table, whatever its cookie: a resynchronised switch keeps nothing stale."""
    body = _FLOW_MOD.pack(
        0,
        0,
        ofp.OFPTT_ALL,
        ofp.OFPFC_DELETE,
        0,
        0,
        ofp.OFP_DEFAULT_PRIORITY,
        ofp.OFP_NO_BUFFER,
        ofp.OFPP_ANY,
        ofp.OFPG_ANY,
        0,
    )  # (priority: ignored by a non-strict delete)
    return _msg(ofp.OFPT_FLOW_MOD, body + _match())


def barrier() -> bytes:
    return _msg(ofp.OFPT_BARRIER_REQUEST, b"")


def bundle_ctrl(bundle_id: int, ctrl: int) -> bytes:
    return _msg(ofp.OFPT_EXPERIMENTER, _BUNDLE.pack(_ONF, ofp.ONF_ET_BUNDLE_CONTROL, bundle_id, ctrl, _BUNDLE_FLAGS))


def bundle_add(bundle_id: int, inner: bytes) -> bytes:
    """`inner` wrapped for a bundle; the two carry the same xid (set both with `with_xid`)."""
    return _msg(
        ofp.OFPT_EXPERIMENTER, _BUNDLE.pack(_ONF, ofp.ONF_ET_BUNDLE_ADD_MESSAGE, bundle_id, 0, _BUNDLE_FLAGS) + inner
    )


def with_xid(msg: bytes, xid: int) -> bytes:
    return msg[:4] + struct.pack("!I", xid) + msg[8:]


def flow_stats_request(cookie: int, mask: int = COOKIE_MASK):
    return parser.OFPFlowStatsRequest(
        None, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, cookie, mask, parser.OFPMatch()
    )


def port_stats_request():
    return parser.OFPPortStatsRequest(None, 0, ofp.OFPP_ANY)


# --- sending with confirmation ----------------------------------------------------------------
class _Pending:
    """One round trip: the messages sent and the barrier (or lone request) that closes it."""

    def __init__(self, dpid: int, event):
        self.dpid = dpid
        self.done = event
        self.error: str | None = None
        self.errors: list[tuple[int, int, int]] = []  # (xid, type, code)
        self.replies: list = []
        self.barrier_xid: int | None = None
        self.xids: list[int] = []


class Batch:
    """Flow-mods for one switch: staged (sent in an open bundle, checked), then committed."""

    def __init__(self, dp, msgs: list[bytes], what: str, bundle_id: int | None):
        self.dp, self.msgs, self.what, self.bundle_id = dp, msgs, what, bundle_id
        self.staged: _Pending | None = None
        self.committed: _Pending | None = None


class OfRpc:
    """Confirmed sends and multipart requests; the owning app feeds it replies and errors."""

    def __init__(self, event):
        self._event = event  # makes the flag a reply sets: the controller runtime's `event`
        self._by_xid: dict[tuple[int, int], _Pending] = {}
        self._bundle_ids = itertools.count(1)
        self.no_bundles: set[int] = set()  # datapaths that refused a bundle

    def _xid(self, dp, pending: _Pending) -> int:
        dp.xid = (dp.xid + 1) & 0xFFFFFFFF
        self._by_xid[(dp.id, dp.xid)] = pending
        pending.xids.append(dp.xid)
        return dp.xid

    def _send_raw(self, dp, parts: list[bytes]) -> None:
        if not dp.send(b"".join(parts)):
            raise SwitchError(f"datapath {dp.id:#x} is not connected")

    def _round_trip(self, dp, msgs: Iterable[bytes], bundle_id: int | None = None) -> _Pending:
        """Send `msgs` (added to bundle `bundle_id`, which this opens, if given) and a barrier, in one write."""
        pending = _Pending(dp.id, self._event())
        parts = []
        if bundle_id is not None:
            parts.append(with_xid(bundle_ctrl(bundle_id, _OPEN), self._xid(dp, pending)))
        for m in msgs:
            xid = self._xid(dp, pending)
            parts.append(
                with_xid(m, xid) if bundle_id is None else with_xid(bundle_add(bundle_id, with_xid(m, xid)), xid)
            )
        pending.barrier_xid = self._xid(dp, pending)
        parts.append(with_xid(barrier(), pending.barrier_xid))
        self._send_raw(dp, parts)
        return pending

    def stage(self, dp, msgs: list[bytes], what: str = "flow changes") -> Batch:
        """Send `msgs` in an open bundle (nothing applied yet) followed by a barrier; see `commit`."""
        if dp.id in self.no_bundles:
            return Batch(dp, msgs, what, None)
        batch = Batch(dp, msgs, what, next(self._bundle_ids))
        batch.staged = self._round_trip(dp, msgs, batch.bundle_id)
        return batch

    def wait_staged(self, batch: Batch, timeout: float) -> None:
        """Wait until the switch checked every staged message; on refusal discard the bundle and raise."""
        if batch.staged is None:
            return
        try:
            self._wait(batch.staged, timeout, batch.what)
        except SwitchError:
            opened = batch.staged.xids[0]
            if any(xid == opened and kind == ofp.OFPET_BAD_REQUEST for xid, kind, _ in batch.staged.errors):
                LOG.warning("datapath %#x does not take bundles: sending messages one by one", batch.dp.id)
                self.no_bundles.add(batch.dp.id)
                batch.staged, batch.bundle_id = None, None
                return
            self._discard(batch)
            raise

    def _discard(self, batch: Batch) -> None:
        if batch.bundle_id is None:  # no bundle opened: nothing staged on the switch
            return
        pending = _Pending(batch.dp.id, self._event())
        try:
            self._send_raw(batch.dp, [with_xid(bundle_ctrl(batch.bundle_id, _DISCARD), self._xid(batch.dp, pending))])
        except SwitchError:
            pass
        finally:
            self._forget(pending)

    def commit(self, batch: Batch) -> None:
        """Apply a staged batch (send the commit and a barrier); `wait_committed` waits for it."""
        if batch.bundle_id is None:  # no bundles here: the messages themselves
            batch.committed = self._round_trip(batch.dp, batch.msgs)
        else:
            batch.committed = self._round_trip(batch.dp, [bundle_ctrl(batch.bundle_id, _COMMIT)])

    def wait_committed(self, batch: Batch, timeout: float) -> None:
        if batch.committed is None:
            raise ValueError(f"{batch.what}: waited for before its commit was sent")
        self._wait(batch.committed, timeout, batch.what)

    def confirm(self, dp, msgs: list[bytes], timeout: float, what: str = "flow changes") -> None:
        """Apply `msgs` on one switch, all at once; return once the switch confirmed them."""
        self.confirm_all([(dp, msgs, what)], timeout)

    def confirm_all(self, batches: list[tuple[Any, list[bytes], str]], timeout: float) -> None:
        """`confirm` on several switches at once: every stage sent before any is waited for, then every
        commit. Switches that confirm are changed even if another fails; the SwitchError raised then
        names the failed datapaths (`datapaths`)."""
        staged, errors = [], {}
        for dp, msgs, what in batches:
            try:
                staged.append(self.stage(dp, msgs, what))
            except SwitchError as e:
                errors[dp.id] = e
        for b in staged:
            try:
                self.wait_staged(b, timeout)
            except SwitchError as e:
                errors[b.dp.id] = e
        committed = []
        for b in staged:  # every commit sent before any is waited for: the switches apply theirs at once
            if b.dp.id in errors:
                continue
            try:
                self.commit(b)
                committed.append(b)
            except SwitchError as e:
                errors[b.dp.id] = e
        for b in committed:
            try:
                self.wait_committed(b, timeout)
            except SwitchError as e:
                errors[b.dp.id] = e
        if errors:
            first = next(iter(errors.values()))
            raise SwitchError(str(first), set(errors))

    def request(self, dp, msg, timeout: float, what: str = "a statistics request") -> list:
        """Send one multipart request (a Ryu message); return every reply body once the last part arrived."""
        pending = _Pending(dp.id, self._event())
        msg.datapath = dp
        msg.xid = None
        dp.set_xid(msg)
        self._by_xid[(dp.id, msg.xid)] = pending
        pending.xids.append(msg.xid)
        if not dp.send_msg(msg):
            raise SwitchError(f"datapath {dp.id:#x} is not connected")
        return self._wait(pending, timeout, what)

    def _wait(self, pending: _Pending, timeout: float, what: str):
        try:
            if not pending.done.wait(timeout):
                raise SwitchError(f"datapath {pending.dpid:#x} did not confirm {what} within {timeout:g} s")
            if pending.error:
                raise SwitchError(f"datapath {pending.dpid:#x} refused {what}: {pending.error}")
            return pending.replies
        finally:
            self._forget(pending)

    def _forget(self, pending: _Pending) -> None:
        for xid in pending.xids:
            self._by_xid.pop((pending.dpid, xid), None)

    # The owning app calls these from its event handlers.
    def on_barrier_reply(self, msg) -> None:
        pending = self._by_xid.get((msg.datapath.id, msg.xid))
        if pending is not None and msg.xid == pending.barrier_xid:
            pending.done.set()

    def on_multipart_reply(self, msg) -> None:
        pending = self._by_xid.get((msg.datapath.id, msg.xid))
        if pending is None:
            return
        pending.replies.extend(msg.body if isinstance(msg.body, list) else [msg.body])
        if not msg.flags & ofp.OFPMPF_REPLY_MORE:
            pending.done.set()

    def on_error(self, msg) -> bool:
        """Record a switch error against the round trip it belongs to; True if it was ours."""
        pending = self._by_xid.get((msg.datapath.id, msg.xid))
        if pending is None:
            return False
        pending.errors.append((msg.xid, msg.type, msg.code))
        pending.error = pending.error or f"OpenFlow error type {msg.type} code {msg.code}"
        if pending.barrier_xid is None:  # a lone request gets no barrier reply
            pending.done.set()
        return True

    def on_disconnect(self, dpid: int) -> None:
        for (d, _), pending in list(self._by_xid.items()):
            if d == dpid and not pending.done.is_set():
                pending.error = "the switch disconnected"
                pending.done.set()

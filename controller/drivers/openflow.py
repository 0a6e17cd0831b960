"""OpenFlow 1.3 southbound: messages built without a datapath, and sending them with confirmation.

Builders return Ryu messages with ``datapath=None``; `OfRpc.confirm` binds them to a datapath,
sends them followed by a barrier, and waits for the barrier reply, failing if the switch
answered any of them with an error. `OfRpc.request` does the same for multipart requests.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from ryu.lib import hub
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

LOG = logging.getLogger("optirack.openflow")

OCS_COOKIE = 0x0C  # circuits
FABRIC_COOKIE = 0x0F  # forwarding
COOKIE_MASK = 0xFFFFFFFFFFFFFFFF
CIRCUIT_PRIORITY = 100
FORWARD_PRIORITY = 100


class SwitchError(RuntimeError):
    """A switch refused a message, did not confirm in time, or went away."""


def _flow(command: int, cookie: int, priority: int, match, out_port: int | None = None):
    instructions = []
    if out_port is not None:
        instructions = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(out_port)])]
    return parser.OFPFlowMod(None, cookie=cookie, cookie_mask=COOKIE_MASK if command != ofp.OFPFC_ADD else 0,
                             table_id=0, command=command, priority=priority, match=match,
                             instructions=instructions, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)


def circuit_add(in_port: int, out_port: int):
    return _flow(ofp.OFPFC_ADD, OCS_COOKIE, CIRCUIT_PRIORITY, parser.OFPMatch(in_port=in_port), out_port)


def circuit_delete(in_port: int):
    return _flow(ofp.OFPFC_DELETE_STRICT, OCS_COOKIE, CIRCUIT_PRIORITY, parser.OFPMatch(in_port=in_port))


def forward_add(ip: str, out_port: int) -> list:
    """Two rules per NIC address: IPv4 to it, and ARP asking for it."""
    return [
        _flow(ofp.OFPFC_ADD, FABRIC_COOKIE, FORWARD_PRIORITY, parser.OFPMatch(eth_type=0x0800, ipv4_dst=ip), out_port),
        _flow(ofp.OFPFC_ADD, FABRIC_COOKIE, FORWARD_PRIORITY, parser.OFPMatch(eth_type=0x0806, arp_tpa=ip), out_port),
    ]


def forward_delete(ip: str) -> list:
    return [
        _flow(ofp.OFPFC_DELETE_STRICT, FABRIC_COOKIE, FORWARD_PRIORITY, parser.OFPMatch(eth_type=0x0800, ipv4_dst=ip)),
        _flow(ofp.OFPFC_DELETE_STRICT, FABRIC_COOKIE, FORWARD_PRIORITY, parser.OFPMatch(eth_type=0x0806, arp_tpa=ip)),
    ]


def delete_all():
    """Every flow of table 0, whatever its cookie: a resynchronised switch keeps nothing stale."""
    return parser.OFPFlowMod(None, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY, match=parser.OFPMatch())


def flow_stats_request(cookie: int):
    return parser.OFPFlowStatsRequest(None, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, cookie, COOKIE_MASK,
                                      parser.OFPMatch())


def port_stats_request():
    return parser.OFPPortStatsRequest(None, 0, ofp.OFPP_ANY)


class _Pending:
    def __init__(self, dpid: int):
        self.dpid = dpid
        self.done = hub.Event()
        self.error: str | None = None
        self.replies: list = []
        self.barrier_xid: int | None = None


class OfRpc:
    """Confirmed sends and multipart requests; the owning app feeds it replies and errors."""

    def __init__(self):
        self._by_xid: dict[tuple[int, int], _Pending] = {}

    def _send(self, dp, msg, pending: _Pending) -> int:
        msg.datapath = dp
        msg.xid = None
        dp.set_xid(msg)
        self._by_xid[(dp.id, msg.xid)] = pending
        if not dp.send_msg(msg):
            raise SwitchError(f"datapath {dp.id:#x} is not connected")
        return msg.xid

    def _wait(self, pending: _Pending, xids: list[int], timeout: float, what: str):
        try:
            if not pending.done.wait(timeout):
                raise SwitchError(f"datapath {pending.dpid:#x} did not confirm {what} within {timeout:g} s")
            if pending.error:
                raise SwitchError(f"datapath {pending.dpid:#x} refused {what}: {pending.error}")
            return pending.replies
        finally:
            for xid in xids:
                self._by_xid.pop((pending.dpid, xid), None)

    def confirm(self, dp, msgs: Iterable, timeout: float, what: str = "flow changes") -> None:
        """Send `msgs` and a barrier; return once the switch has applied them all."""
        pending = _Pending(dp.id)
        xids = [self._send(dp, m, pending) for m in msgs]
        barrier = parser.OFPBarrierRequest(None)
        xids.append(self._send(dp, barrier, pending))
        pending.barrier_xid = barrier.xid
        self._wait(pending, xids, timeout, what)

    def request(self, dp, msg, timeout: float, what: str = "a statistics request") -> list:
        """Send one multipart request; return every reply body once the last part arrived."""
        pending = _Pending(dp.id)
        xid = self._send(dp, msg, pending)
        return self._wait(pending, [xid], timeout, what)

    # The owning app calls these from its event handlers.
    def on_barrier_reply(self, msg) -> None:
        pending = self._by_xid.get((msg.datapath.id, msg.xid))
        if pending is not None:
            pending.done.set()

    def on_multipart_reply(self, msg) -> None:
        pending = self._by_xid.get((msg.datapath.id, msg.xid))
        if pending is None:
            return
        pending.replies.extend(msg.body if isinstance(msg.body, list) else [msg.body])
        if not msg.flags & ofp.OFPMPF_REPLY_MORE:
            pending.done.set()

    def on_error(self, msg) -> bool:
        """Record a switch error against the batch it belongs to; True if it was ours."""
        pending = self._by_xid.get((msg.datapath.id, msg.xid))
        if pending is None:
            return False
        pending.error = f"OpenFlow error type {msg.type} code {msg.code}"
        if pending.barrier_xid is None:  # a lone request gets no barrier reply
            pending.done.set()
        return True

    def on_disconnect(self, dpid: int) -> None:
        for (d, _), pending in list(self._by_xid.items()):
            if d == dpid and not pending.done.is_set():
                pending.error = "the switch disconnected"
                pending.done.set()

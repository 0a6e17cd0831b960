"""Test doubles: an in-memory OpenFlow 1.3 switch that applies the messages the apps send.

`FakeSwitch` takes Ryu messages (encoding each, so a malformed one fails) and raw OpenFlow
bytes (decoding each with Ryu's parser), keeps ONF bundles until they are committed, applies
flow-mods to a flow table, answers barriers and statistics requests through the apps' own
registered handlers, and can say which port a packet would leave by.
"""
from __future__ import annotations

import inspect
import struct

from ryu.controller import ofp_event
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER
from ryu.lib import hub
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser


def deliver(apps, ev) -> None:
    """Call every handler the apps registered (with @set_ev_cls) for this event's class."""
    for app in apps:
        for _, method in inspect.getmembers(app, inspect.ismethod):
            if type(ev) in getattr(method, "callers", {}):
                method(ev)


def state_change(apps, dp, state) -> None:
    ev = ofp_event.EventOFPStateChange(dp)
    ev.state = state
    deliver(apps, ev)


class FakeSwitch:
    ofproto = ofp
    ofproto_parser = parser

    def __init__(self, dpid: int, apps=(), ports=(), refuse_flow_mods: bool = False, silent: bool = False,
                 bundles: bool = True, rt=None):
        self.id = dpid
        self.rt = rt  # whose threads deliver the replies: a virtual runtime's, else the hub's
        self.bundles = bundles  # False: refuse the bundle extension, as a switch without it would
        self.open_bundles: dict[int, list] = {}
        self.committed_bundles = 0
        self.apps = list(apps)
        self.xid = 0
        self.flows: dict[tuple, tuple[int, int | None]] = {}  # (priority, match items) -> (cookie, out port)
        self.sent: list = []
        self.connected = True
        self.refuse_flow_mods, self.silent = refuse_flow_mods, silent
        self.counters = {p: [0, 0] for p in ports}  # port -> [rx_bytes, tx_bytes]

    # --- what Ryu's Datapath offers ----------------------------------------------------
    def set_xid(self, msg):
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid

    def send_msg(self, msg):
        if not self.connected:
            return False
        msg.serialize()  # must encode as OpenFlow 1.3
        self.sent.append(msg)
        self._handle(msg)
        return True

    def send(self, buf: bytes) -> bool:
        """Raw OpenFlow bytes, as Ryu's Datapath.send takes them: one or several messages."""
        if not self.connected:
            return False
        offset = 0
        while offset < len(buf):
            _, msg_type, length, xid = struct.unpack_from("!BBHI", buf, offset)
            self._raw(msg_type, xid, bytes(buf[offset:offset + length]))
            offset += length
        return True

    def _decode(self, data: bytes):
        version, msg_type, length, xid = struct.unpack_from("!BBHI", data)
        if msg_type == ofp.OFPT_FLOW_MOD:
            return parser.OFPFlowMod.parser(self, version, msg_type, length, xid, data)
        if msg_type == ofp.OFPT_BARRIER_REQUEST:
            msg = parser.OFPBarrierRequest(self)
            msg.xid = xid
            return msg
        raise AssertionError(f"the fake does not decode OpenFlow message type {msg_type}")

    def _raw(self, msg_type: int, xid: int, data: bytes) -> None:
        if msg_type != ofp.OFPT_EXPERIMENTER:
            msg = self._decode(data)
            self.sent.append(msg)
            self._handle(msg)
            return
        experimenter, exp_type, bundle_id, ctrl, _ = struct.unpack_from("!IIIHH", data, 8)
        if not self.bundles or experimenter != 0x4F4E4600:
            self._error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_EXPERIMENTER)
        elif exp_type == ofp.ONF_ET_BUNDLE_ADD_MESSAGE:
            inner = self._decode(data[24:])
            assert inner.xid == xid, "a bundled message carries its bundle message's xid"
            if self.refuse_flow_mods:
                self._error(xid, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_TABLE_FULL)
            else:
                self.sent.append(inner)
                self.open_bundles[bundle_id].append(inner)
        elif ctrl == ofp.ONF_BCT_OPEN_REQUEST:
            self.open_bundles[bundle_id] = []
        elif ctrl == ofp.ONF_BCT_COMMIT_REQUEST:
            for msg in self.open_bundles.pop(bundle_id):
                self._flow_mod(msg)
            self.committed_bundles += 1
        elif ctrl == ofp.ONF_BCT_DISCARD_REQUEST:
            self.open_bundles.pop(bundle_id, None)

    def _error(self, xid: int, type_: int, code: int) -> None:
        err = parser.OFPErrorMsg(self, type_=type_, code=code)
        err.xid = xid
        self._reply(err)

    # --- behaviour ---------------------------------------------------------------------
    def connect(self) -> None:
        self.connected = True
        state_change(self.apps, self, MAIN_DISPATCHER)

    def disconnect(self) -> None:
        self.connected = False
        state_change(self.apps, self, DEAD_DISPATCHER)

    def _reply(self, msg) -> None:
        if not self.silent:
            (self.rt.spawn if self.rt else hub.spawn)(deliver, self.apps, ofp_event.ofp_msg_to_ev(msg))

    def _handle(self, msg) -> None:
        if isinstance(msg, parser.OFPFlowMod):
            if self.refuse_flow_mods:
                self._error(msg.xid, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_TABLE_FULL)
                return
            self._flow_mod(msg)
        elif isinstance(msg, parser.OFPBarrierRequest):
            reply = parser.OFPBarrierReply(self)
            reply.xid = msg.xid
            self._reply(reply)
        elif isinstance(msg, parser.OFPFlowStatsRequest):
            body = [parser.OFPFlowStats(table_id=0, duration_sec=0, duration_nsec=0, priority=prio, idle_timeout=0,
                                        hard_timeout=0, flags=0, cookie=cookie, packet_count=0, byte_count=0,
                                        match=parser.OFPMatch(**dict(match)), instructions=self._instructions(out))
                    for (prio, match), (cookie, out) in self.flows.items()
                    if (cookie & msg.cookie_mask) == (msg.cookie & msg.cookie_mask)]
            reply = parser.OFPFlowStatsReply(self, body=body, flags=0)
            reply.xid = msg.xid
            self._reply(reply)
        elif isinstance(msg, parser.OFPPortStatsRequest):
            body = [parser.OFPPortStats(port_no=p, rx_packets=0, tx_packets=0, rx_bytes=rx, tx_bytes=tx, rx_dropped=0,
                                        tx_dropped=0, rx_errors=0, tx_errors=0, rx_frame_err=0, rx_over_err=0,
                                        rx_crc_err=0, collisions=0, duration_sec=0, duration_nsec=0)
                    for p, (rx, tx) in sorted(self.counters.items())]
            reply = parser.OFPPortStatsReply(self, body=body, flags=0)
            reply.xid = msg.xid
            self._reply(reply)

    @staticmethod
    def _instructions(out):
        if out is None:
            return []
        return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(out)])]

    def _flow_mod(self, msg) -> None:
        match = tuple(sorted(msg.match.items()))
        outs = [a.port for i in msg.instructions for a in i.actions]
        if msg.command == ofp.OFPFC_ADD:
            self.flows[(msg.priority, match)] = (msg.cookie, outs[0] if outs else None)
        elif msg.command == ofp.OFPFC_DELETE_STRICT:
            self.flows.pop((msg.priority, match), None)
        elif msg.command == ofp.OFPFC_DELETE and not match:  # by cookie (a mask of 0: every flow), as OVS does
            for key, (cookie, _) in list(self.flows.items()):
                if cookie & msg.cookie_mask == msg.cookie & msg.cookie_mask:
                    del self.flows[key]
        else:
            raise AssertionError(f"the fake does not model flow-mod command {msg.command}")

    def output(self, **packet) -> int | None:
        """The port a packet with these header fields leaves by (highest priority match), or None (drop)."""
        best = None
        for (prio, match), (_, out) in self.flows.items():
            if all(packet.get(k) == v for k, v in match) and (best is None or prio > best[0]):
                best = (prio, out)
        return None if best is None else best[1]

    def circuits(self) -> set[tuple[int, int]]:
        pairs = {(dict(m)["in_port"], out) for (_, m), (_, out) in self.flows.items() if "in_port" in dict(m)}
        return {(min(a, b), max(a, b)) for a, b in pairs if (b, a) in pairs}


def wait_until(predicate, timeout: float = 5.0, what: str = "a condition"):
    """Let green threads run until `predicate()` holds."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        hub.sleep(0.005)


from tests.unit.jobfakes import FakeContainer, FakeDriver, FakeEngines  # noqa: E402,F401 (their old home)

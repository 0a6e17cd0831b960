"""The southbound encoders make exactly Ryu's bytes, and bundles are staged, checked and committed."""
import pytest
from ryu.controller import ofp_event
from ryu.controller.handler import MAIN_DISPATCHER, set_ev_cls
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller.apps.runtime import HUB
from controller.drivers import openflow as of
from tests.unit.fakes import FakeSwitch


class _Dp:
    ofproto, ofproto_parser = ofp, parser


def ryu_bytes(msg, xid: int = 0) -> bytes:
    msg.datapath = _Dp()
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def _ryu_flow(command, cookie, priority, match, out=None, table=0):
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(out)])] if out else []
    return parser.OFPFlowMod(None, cookie=cookie, cookie_mask=of.COOKIE_MASK if command != ofp.OFPFC_ADD else 0,
                             table_id=table, command=command, priority=priority, match=match, instructions=inst,
                             out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)


def test_flow_mods_are_ryus_bytes():
    cases = [
        (of.circuit_add(7, 1011), _ryu_flow(ofp.OFPFC_ADD, of.OCS_COOKIE, 100, parser.OFPMatch(in_port=7), 1011)),
        (of.circuit_delete(7), _ryu_flow(ofp.OFPFC_DELETE_STRICT, of.OCS_COOKIE, 100, parser.OFPMatch(in_port=7))),
        (
            of.forward_add("198.18.1.20", 3)[0],
            _ryu_flow(
                ofp.OFPFC_ADD, of.FABRIC_COOKIE, 100, parser.OFPMatch(eth_type=0x0800, ipv4_dst="198.18.1.20"), 3
            ),
        ),
        (
            of.forward_add("198.18.1.20", 3)[1],
            _ryu_flow(ofp.OFPFC_ADD, of.FABRIC_COOKIE, 100, parser.OFPMatch(eth_type=0x0806, arp_tpa="198.18.1.20"), 3),
        ),
        (
            of.forward_delete("10.0.0.1")[0],
            _ryu_flow(
                ofp.OFPFC_DELETE_STRICT, of.FABRIC_COOKIE, 100, parser.OFPMatch(eth_type=0x0800, ipv4_dst="10.0.0.1")
            ),
        ),
        (
            of.forward_delete("10.0.0.1")[1],
            _ryu_flow(
                ofp.OFPFC_DELETE_STRICT, of.FABRIC_COOKIE, 100, parser.OFPMatch(eth_type=0x0806, arp_tpa="10.0.0.1")
            ),
        ),
        (
            of.delete_all(),
            parser.OFPFlowMod(
                None,
                table_id=ofp.OFPTT_ALL,
                command=ofp.OFPFC_DELETE,
                out_port=ofp.OFPP_ANY,
                out_group=ofp.OFPG_ANY,
                match=parser.OFPMatch(),
            ),
        ),
        (of.barrier(), parser.OFPBarrierRequest(None)),
    ]
    for ours, ryus in cases:
        assert of.with_xid(ours, 0x1234) == ryu_bytes(ryus, 0x1234)


def test_bundle_messages_are_ryus_bytes():
    assert of.with_xid(of.bundle_ctrl(9, ofp.ONF_BCT_COMMIT_REQUEST), 5) == ryu_bytes(
        parser.ONFBundleCtrlMsg(None, 9, ofp.ONF_BCT_COMMIT_REQUEST, ofp.ONF_BF_ATOMIC | ofp.ONF_BF_ORDERED, []), 5
    )
    inner = parser.OFPBarrierRequest(_Dp())
    ryu = ryu_bytes(parser.ONFBundleAddMsg(None, 9, ofp.ONF_BF_ATOMIC | ofp.ONF_BF_ORDERED, inner, []), 6)
    assert of.with_xid(of.bundle_add(9, of.with_xid(of.barrier(), 6)), 6) == ryu


class _Feeder:
    """Feeds an OfRpc the replies, as ConfirmingApp does."""

    def __init__(self, rpc):
        self.rpc = rpc

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier(self, ev):
        self.rpc.on_barrier_reply(ev.msg)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, MAIN_DISPATCHER)
    def _error(self, ev):
        self.rpc.on_error(ev.msg)


def _switch(**kw):
    rpc = of.OfRpc(HUB.event)
    return rpc, FakeSwitch(0x100, [_Feeder(rpc)], **kw)


def test_a_batch_is_applied_at_commit_and_not_before():
    rpc, sw = _switch()
    batch = rpc.stage(sw, [of.circuit_add(1, 2), of.circuit_add(2, 1)], "circuits")
    rpc.wait_staged(batch, 2)
    assert sw.circuits() == set() and len(sw.open_bundles) == 1  # checked, not applied
    rpc.commit(batch)
    rpc.wait_committed(batch, 2)
    assert sw.circuits() == {(1, 2)} and sw.committed_bundles == 1


def test_a_refused_batch_changes_nothing_and_is_discarded():
    rpc, sw = _switch(refuse_flow_mods=True)
    with pytest.raises(of.SwitchError, match="refused circuits"):
        rpc.confirm(sw, [of.circuit_add(1, 2), of.circuit_add(2, 1)], 2, "circuits")
    assert sw.flows == {} and sw.open_bundles == {} and sw.committed_bundles == 0


def test_a_switch_without_bundles_gets_the_messages_one_by_one():
    rpc, sw = _switch(bundles=False)
    rpc.confirm(sw, [of.circuit_add(1, 2), of.circuit_add(2, 1)], 2, "circuits")
    assert sw.circuits() == {(1, 2)} and sw.id in rpc.no_bundles
    rpc.confirm(sw, [of.circuit_delete(1), of.circuit_delete(2)], 2, "circuits")  # remembered: no bundle tried
    assert sw.flows == {}

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
        (of.circuit_add(7, 1011), _ryu_flow(ofp.OFPFC_ADD, 0x70C, 100, parser.OFPMatch(in_port=7), 1011)),
        (
            of.circuit_delete(7),  # whatever its cookie
            parser.OFPFlowMod(None, cookie=of.OCS_COOKIE, cookie_mask=0, command=ofp.OFPFC_DELETE_STRICT, priority=100,
                              match=parser.OFPMatch(in_port=7), out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY),
        ),
        (
            of.circuit_delete_block(8, 4),  # in_ports 8-11: the cookie's bits of the port's lowest two ignored
            parser.OFPFlowMod(None, cookie=0x80C, cookie_mask=0xFFFFFFFFFFFFFCFF, table_id=0,
                              command=ofp.OFPFC_DELETE, priority=0, match=parser.OFPMatch(), out_port=ofp.OFPP_ANY,
                              out_group=ofp.OFPG_ANY),
        ),
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


@pytest.mark.parametrize("ports", [range(1, 1025), [3, 4, 5, 6, 7, 8, 10, 12, 13], [1], [], range(0, 8),
                                   [2, 3, 4, 5, 6, 7, 8, 9, 17, 18, 19, 20, 320]])
def test_port_blocks_cover_exactly_the_ports_in_aligned_blocks(ports):
    blocks = of.port_blocks(ports)
    covered = [p for start, size in blocks for p in range(start, start + size)]
    assert sorted(covered) == sorted(set(ports))  # every port once, no other
    for start, size in blocks:
        assert size & (size - 1) == 0 and start % size == 0  # a power of two, aligned: one cookie mask covers it


def test_a_bulk_change_of_1024_ports_is_11_block_deletes():
    assert len(of.port_blocks(range(1, 1025))) == 11


def test_a_block_delete_removes_exactly_the_circuit_flows_of_its_ports():
    sw = FakeSwitch(1)
    for p in range(1, 40):
        sw.send(of.circuit_add(p, 100 + p))
    sw.flows[(100, (("in_port", 50),))] = (0x0F, 7)  # not a circuit flow: another cookie's low byte
    for start, size in of.port_blocks(range(8, 20)):
        sw.send(of.circuit_delete_block(start, size))
    left = {dict(m)["in_port"] for (_, m) in sw.flows}
    assert left == (set(range(1, 40)) - set(range(8, 20))) | {50}


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


class _OcsFeeder(_Feeder):
    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flows(self, ev):
        self.rpc.on_multipart_reply(ev.msg)


def test_an_ocs_change_darkens_each_changed_port_by_block_and_a_flow_of_another_cookie_alone():
    """The OCS driver deletes by cookie in blocks of ports; a flow its read() found with another cookie (as an older
    rack-up installed them: 0x0c alone) goes by a strict delete, so no changed port stays lit."""
    from controller.core.rack import load_rack
    from controller.drivers.ocs_openflow import OpenFlowOcs
    from tests.unit.test_rack import PAPER

    rpc = of.OfRpc(HUB.event)
    sw = FakeSwitch(0x100, [_OcsFeeder(rpc)])
    ocs = OpenFlowOcs(load_rack(PAPER).spec.ocs[0], rpc, 2, sleep=HUB.sleep)
    ocs.datapath = sw
    for a, b in ((1, 11), (5, 12)):  # the other cookie
        sw.flows[(100, (("in_port", a),))], sw.flows[(100, (("in_port", b),))] = (of.OCS_COOKIE, b), (of.OCS_COOKIE, a)
    for a, b in ((2, 13), (3, 21)):  # the driver's own
        sw.send(of.circuit_add(a, b))
        sw.send(of.circuit_add(b, a))
    assert ocs.read() == {(1, 11), (5, 12), (2, 13), (3, 21)}
    sent = len(sw.sent)
    ocs.apply({(1, 11), (3, 21)}, {(1, 21)})
    assert sw.circuits() == {(5, 12), (2, 13), (1, 21)}
    assert {dict(m)["in_port"] for (_, m) in sw.flows} == {5, 12, 2, 13, 1, 21}  # 11 and 3 dark: no flow left
    deletes = [m for m in sw.sent[sent:] if isinstance(m, parser.OFPFlowMod) and m.command != ofp.OFPFC_ADD]
    assert sorted((m.command, m.cookie) for m in deletes) == [  # 3 and 21 by block (21 is not aligned with 20),
        (ofp.OFPFC_DELETE, of.circuit_cookie(3)), (ofp.OFPFC_DELETE, of.circuit_cookie(21)),
        (ofp.OFPFC_DELETE_STRICT, of.OCS_COOKIE), (ofp.OFPFC_DELETE_STRICT, of.OCS_COOKIE)]  # 1 and 11 alone


def test_the_emulation_sets_the_circuit_cookies_the_controller_deletes_by():
    from emulation.ovs import circuit_cookie

    assert all(circuit_cookie(p) == of.circuit_cookie(p) for p in (1, 2, 320, 1024, 4095))

"""Each Ryu app constructs and handles events with dummy datapaths (fake switches), no network."""
from __future__ import annotations

import json

import pytest
from webob import Request

from controller.apps.context import Optirack
from controller.apps.fabric import FabricApp
from controller.apps.inventory import Inventory
from controller.apps.monitor import MonitorApp
from controller.apps.ocs import OcsApp
from controller.apps.rest import Api, NotFound
from controller.core.circuits import CircuitMap
from controller.core.errors import Busy, ReconfigFailed
from controller.core.forwarding import compute_tables
from controller.core.rack import load_rack
from tests.unit.fakes import FakeSwitch, wait_until
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)
REGROUPED = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:13"], ["ocs1:4", "ocs1:14"],
             ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]]


@pytest.fixture
def rig(tmp_path):
    """The apps on one context, with fake OCS and switches connected."""
    ctx = Optirack(rack=RACK, state_dir=tmp_path)
    apps = [Inventory(optirack=ctx), OcsApp(optirack=ctx), FabricApp(optirack=ctx)]
    ocs = FakeSwitch(0x100, apps)
    switches = {name: FakeSwitch(RACK.switches[name].dpid, apps) for name in ("as1", "as2")}
    for dp in [ocs, *switches.values()]:
        dp.connect()
    initial = {(a.port, b.port) for a, b in CircuitMap.initial(RACK).circuits}
    wait_until(lambda: ocs.circuits() == initial, what="the OCS to get the starting circuits")
    wait_until(lambda: set(apps[2].installed) == {"as1", "as2"}, what="both switches' tables")
    wait_until(lambda: "ocs1" in apps[1].synchronised and not ctx.lock.locked(), what="the OCS synchronised")
    return ctx, apps, ocs, switches


def _check_forwarding(ctx, switches):
    """Every switch sends every NIC address (IPv4 and ARP) out of the port the core computed."""
    tables = compute_tables(RACK, ctx.circuits)
    for name, sw in switches.items():
        for ip, port in tables[name].items():
            assert sw.output(eth_type=0x0800, ipv4_dst=ip) == port
            assert sw.output(eth_type=0x0806, arp_tpa=ip) == port
        assert sw.output(eth_type=0x0800, ipv4_dst="198.18.0.99") is None  # no flooding


def test_empty_ocs_gets_the_starting_circuits_and_switches_their_tables(rig):
    ctx, _, _, switches = rig
    assert ctx.datapaths.keys() == {0x100, 0x201, 0x202}
    _check_forwarding(ctx, switches)
    assert ctx.store.load()["circuits"] == CircuitMap.initial(RACK).to_json()


def test_reconfigure_applies_the_diff_with_a_dark_window(rig):
    ctx, apps, ocs, switches = rig
    target = CircuitMap.parse(RACK, REGROUPED)
    ev = apps[1].changes.reconfigure(target, "circuits", "test")
    assert ocs.circuits() == {(a.port, b.port) for a, b in target.circuits}
    assert ev.status == "ok" and ev.dark_window_s >= 0.025
    assert ev.requested_at <= ev.dark_start <= ev.dark_end <= ev.ocs_confirmed_at <= ev.flows_confirmed_at
    assert len(ev.removed) == 4 and len(ev.added) == 4
    # the switches' new entries went out with the OCS change, not after it; the change ended once they confirmed
    assert ev.requested_at <= ev.fabric_started_at <= ev.dark_end
    assert ev.fabric_started_at <= ev.fabric_confirmed_at <= ev.flows_confirmed_at
    assert ev.to_json()["fabric_confirmed_at"] == ev.fabric_confirmed_at
    _check_forwarding(ctx, switches)
    # untouched circuits were not re-sent: only deletes of changed ports and adds of new ones
    touched = {m.match["in_port"] for m in ocs.sent[-20:] if hasattr(m, "match") and "in_port" in m.match}
    assert 1 not in touched and 11 not in touched


def test_new_forwarding_goes_out_with_the_ocs_change_and_old_entries_after_it(rig, monkeypatch):
    """The switches get the target's new entries while the OCS changes (their programming overlaps its switching
    time); an address that leaves keeps its entry until the OCS confirmed, then loses it."""
    ctx, apps, _, switches = rig
    fabric, driver, log = apps[2].fabric, apps[1].drivers["ocs1"], []
    gone = RACK.addresses["gpu6"][0]  # gpu6's circuit is removed: its address leaves every table
    target = CircuitMap.parse(RACK, REGROUPED[:5])

    def logged(name, fn):
        def call(*args, **kwargs):
            log.append((name, "start"))
            out = fn(*args, **kwargs)
            log.append((name, "end", any(gone in t for t in fabric.installed.values())))
            return out
        return call

    monkeypatch.setattr(fabric, "add_new", logged("add_new", fabric.add_new))
    monkeypatch.setattr(fabric, "remove_left", logged("remove_left", fabric.remove_left))
    monkeypatch.setattr(driver, "apply", logged("ocs", driver.apply))
    ev = apps[1].changes.reconfigure(target, "circuits", "test")
    assert ev.status == "ok"
    assert log.index(("add_new", "start")) < log.index(("ocs", "end", True))  # it started before the OCS confirmed
    assert ("add_new", "end", True) in log  # the leaving address kept its entry through the OCS change
    assert log[-2:] == [("remove_left", "start"), ("remove_left", "end", False)]  # and lost it once the OCS confirmed
    _check_forwarding(ctx, switches)
    assert all(sw.output(eth_type=0x0800, ipv4_dst=gone) is None for sw in switches.values())


def test_reconnected_ocs_is_restored(rig):
    ctx, _, ocs, _ = rig
    ocs.disconnect()
    ocs.flows.clear()  # the device lost its state
    ocs.connect()
    held = {(a.port, b.port) for a, b in ctx.circuits.circuits}
    wait_until(lambda: ocs.circuits() == held, what="the circuits to be restored")
    wait_until(lambda: ctx.events.recent()[-1].kind == "restore", what="a restore event")


def test_reconnected_switch_is_resynchronised(rig):
    ctx, apps, _, switches = rig
    sw = switches["as1"]
    sw.disconnect()
    sw.flows[(5, (("eth_type", 0x0800),))] = (0, 99)  # stale junk the switch kept
    sw.flows = {k: v for k, v in sw.flows.items() if k[0] == 5}
    sw.connect()
    wait_until(lambda: "as1" in apps[2].installed, what="as1 resynchronised")
    assert (5, (("eth_type", 0x0800),)) not in sw.flows
    _check_forwarding(ctx, switches)


def _device_holds(ctx, ocs, switches, circuits: CircuitMap) -> None:
    """What the fake devices hold, not the controller's record: the OCS's flows are `circuits`, and
    every switch forwards as those circuits say."""
    assert ocs.circuits() == {(a.port, b.port) for a, b in circuits.circuits}
    assert ctx.circuits == circuits
    _check_forwarding(ctx, switches)


def test_refused_flow_mods_roll_back(rig):
    ctx, apps, ocs, switches = rig
    before = ctx.circuits
    ocs.refuse_flow_mods = True
    with pytest.raises(ReconfigFailed) as info:
        apps[1].changes.reconfigure(CircuitMap.parse(RACK, REGROUPED), "circuits", "test")
    assert "refused" in info.value.event.error and info.value.event.status == "failed"
    _device_holds(ctx, ocs, switches, before)


def test_a_switch_that_refuses_rolls_the_ocs_back(rig):
    """The OCS took the new circuits, then a packet switch refused its flows: the OCS gets the old
    circuits back, and the switches keep forwarding for them."""
    ctx, apps, ocs, switches = rig
    before = ctx.circuits
    switches["as2"].refuse_flow_mods = True
    with pytest.raises(ReconfigFailed) as info:
        apps[1].changes.reconfigure(CircuitMap.parse(RACK, REGROUPED), "circuits", "test")
    assert info.value.event.ocs_confirmed_at is not None  # the OCS had applied the change
    _device_holds(ctx, ocs, switches, before)


def test_silent_switch_times_out_and_rolls_back(rig, monkeypatch):
    ctx, apps, ocs, switches = rig
    before = ctx.circuits
    apps[1].drivers["ocs1"].timeout = 0.2
    ocs.silent = True
    with pytest.raises(ReconfigFailed, match="did not confirm"):
        apps[1].changes.reconfigure(CircuitMap.parse(RACK, REGROUPED), "circuits", "test")
    assert ctx.circuits == before
    ocs.silent = False  # it answers again: the OCS app puts its circuits back by itself
    wait_until(
        lambda: "ocs1" in apps[1].synchronised and ocs.circuits() == {(a.port, b.port) for a, b in before.circuits},
        10,
        "the OCS resynchronised",
    )
    _device_holds(ctx, ocs, switches, before)


def test_one_reconfiguration_at_a_time(rig):
    ctx, apps, _, _ = rig
    ctx.lock.acquire()
    try:
        with pytest.raises(Busy):
            apps[1].changes.reconfigure(CircuitMap.parse(RACK, REGROUPED), "circuits", "test")
    finally:
        ctx.lock.release()


def test_monitor_computes_throughput(tmp_path):
    ctx = Optirack(rack=RACK, state_dir=tmp_path)
    clock = iter([100.0, 101.0])
    ctx.clock = lambda: next(clock)
    monitor = MonitorApp(optirack=ctx)
    inv = Inventory(optirack=ctx)
    ocs = FakeSwitch(0x100, [monitor, inv], ports=[1, 11])
    ocs.connect()
    wait_until(lambda: monitor.polls >= 1 and ctx.ports._last, what="a first poll")
    ocs.counters[1] = [1_000_000, 250_000]  # the NIC sent 1 MB, received 0.25 MB
    monitor.interval = 0.01
    wait_until(lambda: ctx.ports.latest(0x100, 1) is not None, what="a second poll")
    s = ctx.ports.latest(0x100, 1)
    assert s.rx_bps == 8_000_000 and s.tx_bps == 2_000_000
    monitor._thread.kill()


def _rest(ctx):
    from ryu.app.wsgi import WSGIApplication

    app = WSGIApplication()
    app.register(Api, {"optirack": ctx})
    app.register(NotFound, {"optirack": ctx})
    return app


def test_rest_in_process(rig):
    ctx, _, ocs, _ = rig
    app = _rest(ctx)
    topo = json.loads(Request.blank("/api/v1/topology").get_response(app).body)
    assert topo["gpus"]["gpu3"]["switch"] == {"name": "as2", "port": 1}
    assert topo["ocs"]["ocs1"]["connected"] is True
    req = Request.blank(
        "/api/v1/ocs/circuits",
        method="PUT",
        body=json.dumps({"circuits": REGROUPED}).encode(),
        headers={"Authorization": f"Bearer {ctx.token}"},
    )
    resp = req.get_response(app)
    assert resp.status_int == 200, resp.body
    assert json.loads(resp.body)["event"]["dark_window_s"] >= 0.025
    assert ocs.circuits() == {(int(a[5:]), int(b[5:])) for a, b in REGROUPED}
    events = json.loads(Request.blank("/api/v1/events").get_response(app).body)["events"]
    assert events[-1]["kind"] == "circuits"


def test_the_wiring_builds_each_part_from_the_parts_it_needs(tmp_path):
    """The context builds the parts in order and hands each its collaborators; the apps adapt Ryu's events to them
    (an OCS port's link drop reaches the job service), and the placement app starts the job service's threads."""
    from controller.apps.placement import PlacementApp
    from controller.core.rack import PortRef
    from tests.unit.fakes import FakeDriver
    from tests.unit.test_failover import port_status_event

    driver = FakeDriver()
    ctx = Optirack(rack=RACK, state_dir=tmp_path, containers=driver)
    assert ctx.changes is ctx.ocs.changes and ctx.changes.fabric is ctx.fabric and ctx.changes.state is ctx
    assert ctx.jobs.runs.changes is ctx.changes and ctx.jobs.runs.workers.containers is driver and ctx.jobs.state is ctx
    ocs_app = OcsApp(optirack=ctx)
    assert ocs_app.devices is ctx.ocs and FabricApp(optirack=ctx).fabric is ctx.fabric
    seen = []
    ctx.jobs.link_changed = lambda port, up: seen.append((port, up))
    ocs = FakeSwitch(0x100, [ocs_app])
    ocs.connect()
    port_status_event([ocs_app], ocs, 3, down=True)
    assert seen == [(PortRef("ocs1", 3), False)]
    started = []
    ctx.jobs.start = lambda: started.append(True)
    assert PlacementApp(optirack=ctx).service is ctx.jobs and started == [True]


def test_a_jobs_end_reaches_its_aggregator_out_of_the_switchs_aggregator_port(rig):
    """The fabric's word to an aggregator: a packet-out of as1's aggregator port holding a UDP datagram to the
    aggregator's address that a real aggregator takes as the job's END (its pool freed)."""
    import struct

    from ryu.lib.packet import ethernet, ipv4, packet, udp
    from ryu.ofproto import ofproto_v1_3 as ofp
    from ryu.ofproto import ofproto_v1_3_parser as parser

    from containers import aggproto
    from containers.aggregator import Aggregator
    from controller.core import aggregators

    ctx, apps, _, switches = rig
    a = next(x for x in aggregators.aggregators(RACK) if x.switch == "as1")
    assert ctx.jobs.runs.aggregators is ctx.fabric  # what the job service tells at a job's end
    assert apps[2].fabric.end_aggregation("as1", 0xC0FFEE)
    out = switches["as1"].sent[-1]
    assert isinstance(out, parser.OFPPacketOut) and out.in_port == ofp.OFPP_CONTROLLER
    assert [x.port for x in out.actions] == [a.port]
    pkt = packet.Packet(out.data)
    eth, ip, u = pkt.get_protocol(ethernet.ethernet), pkt.get_protocol(ipv4.ipv4), pkt.get_protocol(udp.udp)
    assert eth.dst == "ff:ff:ff:ff:ff:ff" and eth.ethertype == 0x0800
    assert (ip.src, ip.dst, ip.proto, u.dst_port) == ("198.18.0.0", a.ip, 17, a.udp_port)
    header = out.data[14:34]
    assert sum(struct.unpack("!10H", header)) % 0xFFFF == 0  # the IPv4 header's checksum holds
    agg = Aggregator("127.0.0.1", 0)
    try:
        agg.handle(aggproto.pack(aggproto.JOIN, 0xC0FFEE, 0, 2, 4, 0, 100), ("198.18.0.1", 40000))
        agg.handle(pkt.protocols[-1], (ip.src, u.src_port))
        assert agg.pools == {} and agg.stats["ended"] == 1
    finally:
        agg.close()
    switches["as2"].connected = False  # a switch the controller cannot reach: nothing sent, and it says so
    assert not apps[2].fabric.end_aggregation("as2", 1)

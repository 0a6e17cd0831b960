"""The rack as a Mininet `Topo`: a pure graph built from a rack file, with emulated line rates.

Every link of the rack runs through the OCS bridge or between packet switches. Line rates are
shaped (htb) on the interfaces that stay in the root namespace: the OCS side of every fibre, and
both ends of every uplink. The GPU NIC end is left unshaped because a container takes it over,
and moving an interface to another namespace drops its qdiscs; a circuit joins two ports of
the same rate (checked in controller.core.circuits), so the OCS side shapes both directions.
"""
from __future__ import annotations

from dataclasses import dataclass

from mininet.link import Link, TCIntf
from mininet.topo import Topo

from controller.core.rack import Rack, RackError

MAX_EMULATED_MBPS = 1000.0  # Mininet's htb settings are meant for at most 1 Gbit/s
MIN_EMULATED_MBPS = 0.1


def port_intf(device: str, port: int) -> str:
    """Root-namespace name of a bridge port: ``ocs1-p7``."""
    return f"{device}-p{port}"


@dataclass(frozen=True)
class NicPlan:
    gpu: str
    server: str
    ocs: str
    ocs_port: int
    peer_intf: str  # OCS-side end, root namespace
    mbps: float
    ip: str
    mac: str


def nic_plans(rack: Rack) -> list[NicPlan]:
    scale = rack.spec.emulation
    plans = []
    for name, gpu in rack.gpus.items():
        ref = gpu.nic.ocs_port
        ip, mac = rack.addresses[name]
        plans.append(NicPlan(name, rack.server_of[name], ref.device, ref.port, port_intf(ref.device, ref.port),
                             scale.mbps(gpu.nic.rate_gbps), ip, mac))
    return plans


def check_emulable(rack: Rack) -> None:
    """Refuse rates the emulation cannot shape, naming the field."""
    spec, scale = rack.spec, rack.spec.emulation
    rates = [(f"servers[{i}].gpus[{j}].nic.rate_gbps", g.nic.rate_gbps)
             for i, s in enumerate(spec.servers) for j, g in enumerate(s.gpus)]
    for i, w in enumerate(spec.switches):
        rates += [(f"switches[{i}].downlinks[{j}].rate_gbps", d.rate_gbps) for j, d in enumerate(w.downlinks)]
        rates += [(f"switches[{i}].uplinks[{j}].rate_gbps", u.rate_gbps) for j, u in enumerate(w.uplinks)]
    for field, gbps in rates:
        mbps = scale.mbps(gbps)
        if not MIN_EMULATED_MBPS <= mbps <= MAX_EMULATED_MBPS:
            raise RackError(rack.source, field, f"{gbps:g} Gbit/s x rate_scale {scale.rate_scale:g} = {mbps:g} Mbit/s; "
                            f"the emulation shapes {MIN_EMULATED_MBPS:g} to {MAX_EMULATED_MBPS:g} Mbit/s "
                            "(change emulation.rate_scale)")


class ShapedIntf(TCIntf):
    """Mininet's htb shaping with an explicit quantum (one class, so fairness is moot), which
    keeps the kernel from warning that rate/r2q is too big at every rate above 16 Mbit/s."""

    def bwCmds(self, bw=None, **kw):  # noqa: N802 (Mininet's name)
        if bw is None:
            return [], " root "
        return ["%s qdisc add dev %s root handle 5:0 htb default 1",
                "%s class add dev %s parent 5:0 classid 5:1 htb " + f"rate {bw:f}Mbit burst 15k quantum 1514"], " parent 5:1 "


def _shaped(mbps: float | None) -> dict:
    # tx checksum offload off: TCP through userspace OVS over veth stalls with it on.
    params = {"txo": False, "gro": False}
    if mbps is not None:
        params["bw"] = mbps
    return params


class RackTopo(Topo):
    """Servers as hosts, the OCS and the packet switches as switches, fibres and uplinks as links."""

    def build(self, rack: Rack):  # noqa: D102 (Topo's hook)
        self.rack = rack
        scale = rack.spec.emulation
        for o in rack.spec.ocs:
            self.addSwitch(o.name, dpid=f"{o.dpid:016x}", role="ocs")
        for w in rack.spec.switches:
            self.addSwitch(w.name, dpid=f"{w.dpid:016x}", role=w.role)
        for s in rack.spec.servers:
            self.addHost(s.name, ip=None)  # GPU NIC addresses come from the rack file, below
        for nic in nic_plans(rack):
            self.addLink(nic.ocs, nic.server, port1=nic.ocs_port, intfName1=nic.peer_intf, intfName2=nic.gpu,
                         cls=Link, cls1=ShapedIntf, cls2=ShapedIntf, params1=_shaped(nic.mbps), params2=_shaped(None),
                         addr2=nic.mac)
        done = set()
        for w in rack.spec.switches:
            for d in w.downlinks:
                ref = d.ocs_port
                self.addLink(ref.device, w.name, port1=ref.port, port2=d.port,
                             intfName1=port_intf(ref.device, ref.port), intfName2=port_intf(w.name, d.port),
                             cls=Link, cls1=ShapedIntf, cls2=ShapedIntf, params1=_shaped(scale.mbps(d.rate_gbps)),
                             params2=_shaped(None))
            for u in w.uplinks:
                key = frozenset([(w.name, u.port), (u.peer.device, u.peer.port)])
                if key in done:
                    continue
                done.add(key)
                mbps = scale.mbps(u.rate_gbps)
                self.addLink(w.name, u.peer.device, port1=u.port, port2=u.peer.port,
                             intfName1=port_intf(w.name, u.port), intfName2=port_intf(u.peer.device, u.peer.port),
                             cls=Link, cls1=ShapedIntf, cls2=ShapedIntf, params1=_shaped(mbps), params2=_shaped(mbps))

"""The rack as a Mininet `Topo`: a pure graph built from a rack file, with emulated line rates.

Mininet makes the bridges, the servers and the veth links: each GPU NIC to its OCS port, and the
uplinks between packet switches. The fibres between aggregator downlinks and OCS ports are OVS
patch ports, added after Mininet starts (see `downlink_patches`): in the userspace datapath a
packet then crosses OCS, aggregator and OCS again in one pass with no system call, which on two
cores triples what the emulated rack carries (measured: four concurrent flows at 100 Mbit/s got
67 % of the line rate over veth fibres, 79 % over patch ports, when the datapath was chosen).

Line rates (htb): on the OCS port facing each NIC (traffic to the NIC), on the NIC's port in its
server (traffic from it: the NIC is a macvlan on that port and sends through the port's qdisc,
wherever the NIC's namespace is), and on both ends of every uplink. A circuit joins two
ports of the same rate (checked in controller.core.circuits), so a NIC's two directions are
shaped at its rate wherever its circuit goes.
"""
from __future__ import annotations

from mininet.link import Link, TCIntf
from mininet.topo import Topo

from controller.core import aggregators
from controller.core.emulated import nic_plans, port_intf
from controller.core.rack import Rack, RackError
from emulation.shaping import DEV, QUEUE_FRAMES, bucket_bytes, htb_commands, queue_frames

MAX_EMULATED_MBPS = 1000.0  # Mininet's htb settings are meant for at most 1 Gbit/s
MIN_EMULATED_MBPS = 0.1


def check_emulable(rack: Rack) -> None:
    """Refuse rates the emulation cannot shape and aggregators it cannot place, naming the field."""
    aggregators.check(rack)
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
    """Mininet's TCIntf with optirack's shaping (emulation/shaping.py) instead of its single htb class,
    and the rack's MTU set before the shaper is sized for it."""

    def config(self, mtu: int = 1500, frames: int = QUEUE_FRAMES, flows: list[str] | None = None,
               bucket: int | None = None, **params):
        self.mtu, self.frames, self.flows, self.bucket = mtu, frames, flows, bucket
        self.cmd("ip", "link", "set", "dev", self.name, "mtu", str(mtu))
        return super().config(**params)

    def bwCmds(self, bw=None, **kw):  # noqa: N802 (Mininet's name)
        if bw is None:
            return [], " root "
        cmds = htb_commands(bw, self.mtu, self.frames, self.flows, self.bucket)
        return ["%s " + " ".join("%s" if a == DEV else a for a in args) for args in cmds], " parent 5:20 "


def _shaped(mbps: float | None, mtu: int, frames: int, flows: list[str] | None = None,
            bucket: int | None = None) -> dict:
    # tx checksum offload off: TCP through userspace OVS over veth stalls with it on.
    params = {"txo": False, "gro": False, "mtu": mtu, "frames": frames, "flows": flows, "bucket": bucket}
    if mbps is not None:
        params["bw"] = mbps
    return params


class RackTopo(Topo):
    """Servers as hosts, the OCS and the packet switches as switches, fibres and uplinks as links."""

    def build(self, rack: Rack):  # noqa: D102 (Topo's hook)
        self.rack = rack
        scale = rack.spec.emulation
        frames = queue_frames(scale.fabric, len(rack.gpus))
        # Where rings' flows meet (the uplinks), the lossless fabric shares the port fairly among the GPU NICs the
        # traffic goes to (emulation/shaping.py); the droptail fabric keeps one FIFO, as before.
        fair = [n.ip for n in nic_plans(rack)] if scale.fabric == "lossless" else None
        for o in rack.spec.ocs:
            self.addSwitch(o.name, dpid=f"{o.dpid:016x}", role="ocs")
        for w in rack.spec.switches:
            self.addSwitch(w.name, dpid=f"{w.dpid:016x}", role=w.role)
        for s in rack.spec.servers:
            self.addHost(s.name, ip=None)  # GPU NIC addresses come from the rack file, below
        for nic in nic_plans(rack):
            # The server's end is the NIC's port; the NIC that moves into containers is a macvlan on
            # it (emulation/nics.py), so both ends stay put and keep their shaping.
            self.addLink(nic.ocs, nic.server, port1=nic.ocs_port, intfName1=nic.peer_intf, intfName2=nic.port,
                         cls=Link, cls1=ShapedIntf, cls2=ShapedIntf, params1=_shaped(nic.mbps, nic.mtu, frames),
                         params2=_shaped(nic.mbps, nic.mtu, frames))
        done = set()
        for w in rack.spec.switches:
            for u in w.uplinks:
                key = frozenset([(w.name, u.port), (u.peer.device, u.peer.port)])
                if key in done:
                    continue
                done.add(key)
                mbps = scale.mbps(u.rate_gbps)
                self.addLink(w.name, u.peer.device, port1=u.port, port2=u.peer.port,
                             intfName1=port_intf(w.name, u.port), intfName2=port_intf(u.peer.device, u.peer.port),
                             cls=Link, cls1=ShapedIntf, cls2=ShapedIntf,
                             params1=_shaped(mbps, scale.mtu, frames, fair, bucket_bytes(mbps)),
                             params2=_shaped(mbps, scale.mtu, frames, fair, bucket_bytes(mbps)))


def port_mtus(rack: Rack) -> list[str]:
    """ovs-vsctl arguments that ask OVS for the rack's MTU on every veth port of a bridge (patch
    ports have none): without it OVS may size a port's buffers for 1500-byte frames."""
    mtu = rack.spec.emulation.mtu
    names = [n.peer_intf for n in nic_plans(rack)]
    names += [port_intf(w.name, u.port) for w in rack.spec.switches for u in w.uplinks]
    return [a for n in names for a in ("--", "set", "interface", n, f"mtu_request={mtu}")]


def downlink_patches(rack: Rack) -> list[str]:
    """ovs-vsctl arguments that cable every aggregator downlink to its OCS port with a patch pair."""
    args: list[str] = []
    for w in rack.spec.switches:
        for d in w.downlinks:
            ocs_end, sw_end = port_intf(d.ocs_port.device, d.ocs_port.port), port_intf(w.name, d.port)
            args += ["--", "add-port", d.ocs_port.device, ocs_end, "--", "set", "interface", ocs_end, "type=patch",
                     f"options:peer={sw_end}", f"ofport_request={d.ocs_port.port}",
                     "--", "add-port", w.name, sw_end, "--", "set", "interface", sw_end, "type=patch",
                     f"options:peer={ocs_end}", f"ofport_request={d.port}"]
    return args

"""GPU NICs of the emulated rack in their home, the server namespace: address them, and
recreate one that a crashed container took down with it."""
from __future__ import annotations

from controller.core.rack import Rack
from controller.drivers import netns as ns
from emulation import ovs
from emulation.plan import NicPlan, netns_of, nic_plans
from emulation.shaping import DEV, htb_commands


def rdma_like_tcp(netns: str, ifname: str, rack: Rack) -> None:
    """TCP stands in for RoCE, which starts at line rate and keeps it across idle time: no slow
    start after the compute phase, and a large initial window on the job's subnet. Each socket
    may queue only two frames in the NIC's shaper (TCP small queues): the rest waits in the
    socket, so a segment's round trip is not inflated by its own queue, and TCP does not take
    the queueing for a loss and retransmit what is still waiting to leave this host."""
    frames = 2 * (rack.spec.emulation.mtu + 14)
    ns.in_netns(netns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0",
                f"net.ipv4.tcp_limit_output_bytes={frames}")
    ns.ip("route", "replace", str(rack.spec.network.subnet), "dev", ifname, "proto", "kernel", "scope", "link",
          "initcwnd", "64", "initrwnd", "64", netns=netns)


def prepare_server(netns: str) -> None:
    """Several NICs on one subnet in one namespace: each answers ARP for, and sends from, its own address."""
    for key in ("all", "default"):
        ns.in_netns(netns, "sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=0", f"net.ipv4.conf.{key}.arp_ignore=1",
                    f"net.ipv4.conf.{key}.arp_announce=2")


def shape(ifname: str, netns: str | None, mbps: float, mtu: int) -> None:
    """The NIC's line rate on its own egress (see emulation/shaping.py, and emulation/topo.py for
    where else rates are shaped)."""
    prefix = ["tc", *(["-n", netns] if netns else [])]
    for args in htb_commands(mbps, mtu):
        ns.run(*prefix, *[ifname if a == DEV else a for a in args])


def address(nic: NicPlan, rack: Rack) -> None:
    """Address and shape a NIC in its server namespace, with a source route so replies leave by the same NIC."""
    netns, subnet = netns_of(nic.server), rack.spec.network.subnet
    ns.in_netns(netns, "sysctl", "-qw", f"net.ipv4.conf.{nic.ifname}.rp_filter=0",
                f"net.ipv4.conf.{nic.ifname}.arp_ignore=1", f"net.ipv4.conf.{nic.ifname}.arp_announce=2")
    ns.address(nic.ifname, netns, f"{nic.ip}/{subnet.prefixlen}")
    shape(nic.ifname, netns, nic.mbps, nic.mtu)
    ns.ip("route", "replace", str(subnet), "dev", nic.ifname, "src", nic.ip, "table", str(nic.table), netns=netns)
    if f"from {nic.ip} lookup {nic.table}" not in ns.ip("rule", "show", netns=netns):
        ns.ip("rule", "add", "from", nic.ip, "table", str(nic.table), netns=netns)


def recreate(nic: NicPlan, rack: Rack) -> None:
    """Rebuild a NIC's veth pair and its OCS port, shaped as before, then address it."""
    netns = netns_of(nic.server)
    if ns.has_link(nic.peer_intf, None):
        ns.ip("link", "delete", "dev", nic.peer_intf)
    ns.ip("link", "add", nic.peer_intf, "address", _peer_mac(nic), "mtu", str(nic.mtu), "type", "veth", "peer", "name",
          nic.ifname, "address", nic.mac, "mtu", str(nic.mtu), "netns", netns)
    # Two transactions: a delete and an add of the same name in one would leave OVS holding the
    # dead interface.
    ovs.vsctl("--if-exists", "del-port", nic.ocs, nic.peer_intf)
    ovs.vsctl("add-port", nic.ocs, nic.peer_intf, "--", "set", "interface", nic.peer_intf, f"ofport_request={nic.ocs_port}",
              f"mtu_request={nic.mtu}")
    shape(nic.peer_intf, None, nic.mbps, nic.mtu)
    ns.run("ethtool", "-K", nic.peer_intf, "tx", "off", "gro", "off", check=False)
    ns.ip("link", "set", "dev", nic.peer_intf, "up")
    address(nic, rack)


def _peer_mac(nic: NicPlan) -> str:
    return "06" + nic.mac[2:]  # locally administered, distinct from the NIC's


class EmulatedNicHome:
    """Where a GPU's NIC lives when no container holds it: its emulated server's namespace."""

    def __init__(self, rack: Rack):
        self.rack = rack
        self.plans = {p.gpu: p for p in nic_plans(rack)}

    def netns(self, server: str) -> str:
        return netns_of(server)

    def restore(self, gpu: str) -> None:
        address(self.plans[gpu], self.rack)

    def adopt(self, gpu: str, netns: str, ifname: str) -> None:
        """The NIC is in a container now: shape it there again (the move dropped its qdisc)."""
        shape(ifname, netns, self.plans[gpu].mbps, self.plans[gpu].mtu)
        rdma_like_tcp(netns, ifname, self.rack)

    def recreate(self, gpu: str) -> None:
        recreate(self.plans[gpu], self.rack)

"""GPU NICs of the emulated rack at home, in their server's namespace.

Each GPU's cable ends in the server at a veth "port" (its peer is the OCS port); the NIC itself is
a macvlan on that port, the emulated analogue of an SR-IOV VF: it is what the CNI host-device
plugin moves into a container's namespace. The port never moves, so its line-rate shaping (and
the OCS port's, for the other direction) holds wherever the NIC is, and a NIC that dies with a
container's namespace takes nothing else with it: the helper container recreates it on the port.
"""
from __future__ import annotations

from controller.core.emulated import IPV4_ONLY_SYSCTLS, LOSSLESS_SYSCTLS, NicPlan, netns_of, route_window
from controller.core.rack import Rack
from emulation import netns as ns


def prepare_server(netns: str, fabric: str = "droptail") -> None:
    """Several NICs on one subnet in one namespace: each answers ARP for, and sends from, its own
    address. Set on `default` too, so a NIC that comes home (or is recreated) inherits it. On the
    lossless fabric, TCP as in a container's sandbox (emulation/shaping.py). IPv4 alone, as in a sandbox."""
    ns.in_netns(netns, "sysctl", "-qw", *(f"{k}={v}" for k, v in IPV4_ONLY_SYSCTLS.items()))
    if fabric == "lossless":
        ns.in_netns(netns, "sysctl", "-qw", *(f"{k}={v}" for k, v in LOSSLESS_SYSCTLS.items()))
    for key in ("all", "default"):
        ns.in_netns(netns, "sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=0", f"net.ipv4.conf.{key}.arp_ignore=1",
                    f"net.ipv4.conf.{key}.arp_announce=2")


def make(nic: NicPlan, rack: Rack) -> None:
    """The NIC (a macvlan with the GPU's MAC on its port) in its server, addressed, with a source
    route so replies leave by the same NIC."""
    netns, subnet = netns_of(nic.server), rack.spec.network.subnet
    if not ns.has_link(nic.ifname, netns):
        ns.ip("link", "add", nic.ifname, "link", nic.port, "address", nic.mac, "type", "macvlan", "mode", "bridge",
              netns=netns)
    ns.address(nic.ifname, netns, f"{nic.ip}/{subnet.prefixlen}")
    ns.ip("route", "replace", str(subnet), "dev", nic.ifname, "src", nic.ip, "table", str(nic.table),
          *route_window(rack.spec.emulation.fabric), netns=netns)
    if f"from {nic.ip} lookup {nic.table}" not in ns.ip("rule", "show", netns=netns):
        ns.ip("rule", "add", "from", nic.ip, "table", str(nic.table), netns=netns)

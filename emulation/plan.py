"""Names and rates of the emulated rack's interfaces, derived from the rack file (no Mininet import)."""
from __future__ import annotations

from dataclasses import dataclass

from controller.core.rack import Rack

NETNS_PREFIX = "optirack-"


def port_intf(device: str, port: int) -> str:
    """Root-namespace name of a bridge port: ``ocs1-p7``."""
    return f"{device}-p{port}"


def nic_port(gpu: str) -> str:
    """The server-side end of a GPU NIC's cable: ``gpu1-port`` (GPU names have at most 9 characters)."""
    return f"{gpu}-port"


def netns_of(server: str) -> str:
    """The pinned network namespace of an emulated server."""
    return f"{NETNS_PREFIX}{server}"


@dataclass(frozen=True)
class NicPlan:
    gpu: str
    ifname: str  # the NIC's interface name (the GPU's name unless the rack file says otherwise)
    port: str  # the server's end of the NIC's cable (a veth whose peer is the OCS port); the NIC is a macvlan on it
    server: str
    ocs: str
    ocs_port: int
    peer_intf: str  # OCS-side end, root namespace
    mbps: float
    mtu: int
    ip: str
    mac: str
    table: int  # routing table of this NIC's source route in its server namespace


def nic_plans(rack: Rack) -> list[NicPlan]:
    scale = rack.spec.emulation
    plans = []
    for i, (name, gpu) in enumerate(rack.gpus.items()):
        ref = gpu.nic.ocs_port
        ip, mac = rack.addresses[name]
        plans.append(
            NicPlan(
                name,
                rack.interface(name),
                nic_port(name),
                rack.server_of[name],
                ref.device,
                ref.port,
                port_intf(ref.device, ref.port),
                scale.mbps(gpu.nic.rate_gbps),
                scale.mtu,
                ip,
                mac,
                100 + i,
            )
        )
    return plans

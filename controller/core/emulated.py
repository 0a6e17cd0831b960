"""The emulated rack as the controller must know it, derived from the rack file: the names of its interfaces and
namespaces, each GPU NIC's settings on the lossless or droptail fabric, and where the emulation keeps its run-time
state. The emulation (emulation/) builds from these; the controller's container driver hands the NIC settings to
the NIC helper, so the controller never imports the emulation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from controller.core.rack import Rack

RUN_DIR = Path(os.environ.get("OPTIRACK_RUN_DIR", "/run/optirack"))
STATE_FILE = "rack.json"  # under RUN_DIR: what `optirack-rack up` made (emulation.rack.RackState)


def emulated_rack_name() -> str | None:
    """The name of the emulated rack that is up on this host, or None."""
    try:
        return json.loads((RUN_DIR / STATE_FILE).read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None


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


# The lossless fabric (emulation.fabric: lossless, the default). RoCE with PFC never drops: a full
# queue pauses its senders. Our kernels have no PFC, so the same guarantee is built from two bounds:
# each TCP flow has at most about WINDOW_SEGMENTS segments in flight (the receiver's buffer, below:
# the route's `cwnd lock` alone bounds only a namespace's second connection to a peer, since the
# kernel applies it from its TCP metrics cache, empty for the first; a container's gloo connections
# are all first ones, and ran with congestion windows of up to 71 segments and receive windows of up
# to 850 kB), and every queue holds the windows of all the flows
# that can ever meet there (FLOWS_PER_GPU per GPU NIC of the rack, each way). Flows meeting at a
# bottleneck then slow down and share it about evenly (each has the same window in the same queue)
# instead of losing packets. Four jumbo segments cover a NIC's bandwidth-delay product at the
# emulated rates (scripts/bench_allreduce.py). Open vSwitch's transmit socket holds 8 MB
# (scripts/setup.sh), far more than every window of the rack together.
WINDOW_SEGMENTS = 4


# A tail loss probe resends a flow's last segment when its acknowledgement is late by twice the
# smoothed round trip: behind the windows of the other flows in a lossless queue it is late with
# nothing lost, and every such probe is a needless retransmission (TCPDSACKRecv counts them back).
# Set in every container sandbox and in every server's namespace (the calibration's iperf3 flows).
# The receive buffer bounds what a sender may have in flight (its window) whatever its congestion control: two
# frames of buffer per segment of window (the kernel advertises about half of its buffer, the rest being each
# packet's overhead), fixed (no autotuning above it).
RECEIVE_BUFFER = 2 * WINDOW_SEGMENTS * (9000 + 14)
LOSSLESS_SYSCTLS = {"net.ipv4.tcp_early_retrans": "0",
                    "net.ipv4.tcp_rmem": f"4096 {RECEIVE_BUFFER} {RECEIVE_BUFFER}"}
# The emulated fabric carries IPv4 alone (no switch has a rule for anything else): a NIC that comes up with IPv6
# sends its duplicate-address probes, router solicitations and listener reports into it for nothing.
IPV4_ONLY_SYSCTLS = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}


# TCP's retransmission timer runs in real time, and a round trip through a lossless queue at a low
# emulated rate (the windows of every crossing flow ahead: 4 x 4 jumbo frames at 6.9 Mbit/s are
# 167 ms) can outlast the default floor (the smoothed round trip + 200 ms) with nothing lost: a
# spurious timeout, which stalls the flow and resends its window (seen: TCPTimeouts, undone by
# DSACK). A floor of 500 ms on the NIC's route keeps the timer behind the deepest such queue.
RTO_MIN = "500ms"


def route_window(fabric: str) -> list[str]:
    """`ip route` arguments that bound a GPU NIC's TCP flows on `fabric` (none on droptail, where
    the initial window of 64 that stands in for RoCE's line-rate start stays)."""
    if fabric == "lossless":
        n = str(WINDOW_SEGMENTS)
        return ["initcwnd", n, "initrwnd", "64", "cwnd", "lock", n, "rto_min", RTO_MIN]
    return ["initcwnd", "64", "initrwnd", "64"]

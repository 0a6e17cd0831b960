"""What a GPU's sandbox and its NIC hand-over need (controller/drivers/containers.py): the sandbox namespace's TCP
settings, the capabilities of the helper that moves the NIC (containers/helper/optirack-nic), and, on the emulated
rack, what the helper needs to rebuild a NIC at home."""
from __future__ import annotations

from controller.core.emulated import IPV4_ONLY_SYSCTLS, LOSSLESS_SYSCTLS, nic_plans, route_window
from controller.core.rack import Rack


def sandbox_sysctls(emulated_mtu: int | None, fabric: str = "droptail") -> dict[str, str]:
    """The sandbox namespace's TCP, standing in for RoCE: no slow start after an idle compute phase.
    On an emulated NIC also TCP small queues of two frames: segments wait in the socket rather than
    in the shaped NIC's queue, so a round trip is not inflated by its own queue, and TCP does not
    take that queueing for a loss and retransmit what has not yet left the host. On the emulated
    lossless fabric, where nothing is lost, also no tail loss probes (emulation/shaping.py). On an
    emulated NIC, IPv4 alone: the emulated fabric forwards nothing else."""
    out = {"net.ipv4.tcp_slow_start_after_idle": "0"}
    if emulated_mtu:
        out["net.ipv4.tcp_limit_output_bytes"] = str(2 * (emulated_mtu + 14))
        out.update(IPV4_ONLY_SYSCTLS)
        if fabric == "lossless":
            out.update(LOSSLESS_SYSCTLS)
    return out


HELPER_CAPS = ["NET_ADMIN", "SYS_ADMIN"]  # what the helper needs (--privileged is refused on some hosts)


def home_settings(rack: Rack) -> dict[str, dict[str, str]]:
    """Per GPU, what the helper needs to rebuild the emulated NIC at home (its port, MAC, route table)."""
    route = " ".join(route_window(rack.spec.emulation.fabric))  # the fabric's bound on each flow's window
    return {p.gpu: {"PORT": p.port, "MAC": p.mac, "TABLE": str(p.table), "ROUTE": route} for p in nic_plans(rack)}

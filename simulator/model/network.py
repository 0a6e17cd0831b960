"""The network a simulated job's ring crosses: links from the rack file, routes from the controller.

A GPU's NIC caps each of its flows; packet switches are non-blocking; every inter-switch hop is a
directed link (one per uplink port and direction) with the uplink's rate. Routes are the
controller's own (`controller.core.forwarding.next_hop_ports`), so a simulated flow crosses
exactly the links the fabric app would send it over.
"""
from __future__ import annotations

from dataclasses import dataclass

from controller.core.forwarding import next_hop_ports, switch_links
from controller.core.rack import Rack

GBPS = 1e9 / 8  # bytes per second in one Gbit/s
SHARINGS = {"maxmin": "max-min sharing (idle capacity handed over at once)",
            "held": "held shares (a ring keeps its share of a link through its compute phases)"}


@dataclass(frozen=True)
class NetParams:
    """What sets a ring step's time besides the link rates (see simulator/model/calibration.py).

    efficiency: the fraction of a link's line rate one transfer's payload reaches (protocol
      headers, the transport's own losses); applied to every NIC and uplink.
    step_latency_s: a fixed cost per ring step (software, synchronisation), in rack seconds.
    small_step_latency_s, small_chunk_bytes: where set, a step whose chunk (S/n, rack bytes) is at most
      small_chunk_bytes costs small_step_latency_s instead (the emulated fabric's, simulator/model/calibration.py);
      None: every step costs step_latency_s.
    sharing: how rings placed on one link share it.
      "maxmin": the rings transferring at the moment share it max-min fairly, and a ring that
        computes or waits leaves its share to the others at once: a lossless fabric whose rate
        control reclaims idle capacity within microseconds (RoCE with PFC, the target racks).
      "held": every ring keeps its max-min share among all the rings placed on the link through
        its compute phases and latency gaps, so what a computing ring leaves idle stays idle:
        what the emulation's TCP flows over shallow drop-tail queues do (simulator/model/calibration.py).
    """

    efficiency: float = 0.95
    step_latency_s: float = 20e-6
    sharing: str = "maxmin"
    small_step_latency_s: float | None = None
    small_chunk_bytes: float = 0.0

    def step_latency(self, chunk_bytes: float) -> float:
        """The fixed cost of a ring step moving `chunk_bytes` (rack bytes) on each flow."""
        if self.small_step_latency_s is not None and chunk_bytes <= self.small_chunk_bytes:
            return self.small_step_latency_s
        return self.step_latency_s

    def __post_init__(self):
        if self.sharing not in SHARINGS:
            raise ValueError(f"sharing must be one of {', '.join(SHARINGS)}, not {self.sharing!r}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], not {self.efficiency}")
        if self.step_latency_s < 0:
            raise ValueError(f"step_latency_s must be >= 0, not {self.step_latency_s}")
        small = self.small_step_latency_s
        if small is not None and not (small >= 0 and self.small_chunk_bytes >= 0):
            raise ValueError("small_step_latency_s and small_chunk_bytes must be >= 0")


class Fabric:
    """Directed inter-switch links of a rack (ids 0..n-1) and the route between any two switches."""

    def __init__(self, rack: Rack):
        self.rack = rack
        self.link_ids: dict[tuple[str, int], int] = {}  # (switch, uplink port) -> id, for the direction out of it
        self.capacity: list[float] = []  # bytes/s at line rate
        self.names: list[str] = []
        for w in rack.spec.switches:
            for u in w.uplinks:
                self.link_ids[(w.name, u.port)] = len(self.capacity)
                self.capacity.append(u.rate_gbps * GBPS)
                self.names.append(f"{w.name}:{u.port}->{u.peer}")
        self._hops, links = next_hop_ports(rack), switch_links(rack)
        self._peer = {at: {p: n for n, p in ports.items()} for at, ports in links.items()}  # port -> neighbour
        self._routes: dict[tuple[str, str], tuple[int, ...]] = {}  # filled as rings ask (all pairs: S^2 on big racks)
        self.nic_bps = {g: spec.nic.rate_gbps * GBPS for g, spec in rack.gpus.items()}  # each GPU's NIC, bytes/s

    def route(self, src: str, dst: str) -> tuple[int, ...]:
        if src == dst:
            return ()
        key = (src, dst)
        if key not in self._routes:
            if dst not in self._hops.get(src, {}):
                raise ValueError(f"no path between switches {src} and {dst}")
            route, at = [], src
            while at != dst:
                port = self._hops[at][dst]
                route.append(self.link_ids[(at, port)])
                at = self._peer[at][port]
            self._routes[key] = tuple(route)
        return self._routes[key]


@dataclass(frozen=True)
class RingNet:
    """A placed job's ring as the network sees it: one flow per rank to the next rank."""

    cap: float  # bytes/s: the slowest NIC among the ring's flows, at line rate
    links: dict[int, int]  # link id -> how many of the ring's flows cross it (one direction)
    crossings: int  # flows that leave their switch


def ring_net(fabric: Fabric, gpus: tuple[str, ...] | list[str], where: dict[str, str],
             nvlink_bps: float = 0.0) -> RingNet:
    """The ring rank i -> rank i+1 over `gpus` (in rank order); `where`: the switch each hangs under.
    `nvlink_bps` > 0: a flow between two GPUs of one server goes over the server's NVLink domain at
    that rate, not through the NICs (0: every flow leaves through its NIC, as in the emulation)."""
    rack = fabric.rack
    n = len(gpus)
    nic = fabric.nic_bps
    rates = [nic[g] for g in gpus]
    if nvlink_bps > 0 and n > 1:
        server = rack.server_of
        rates = [nvlink_bps if server[g] == server[gpus[(i + 1) % n]]
                 else min(rates[i], rates[(i + 1) % n]) for i, g in enumerate(gpus)]
        if all(server[g] == server[gpus[0]] for g in gpus):
            return RingNet(min(rates), {}, 0)  # inside one server: no switch sees it
    links: dict[int, int] = {}
    crossings = 0
    if n < 2:
        return RingNet(min(rates), {}, 0)
    for i, g in enumerate(gpus):
        h = gpus[(i + 1) % n]
        if g not in where or h not in where:
            raise ValueError(f"{g if g not in where else h} has no circuit to a switch")
        route = fabric.route(where[g], where[h])
        if route:
            crossings += 1
        for link in route:
            links[link] = links.get(link, 0) + 1
    return RingNet(min(rates), links, crossings)

"""Proactive forwarding: where every GPU NIC is, and the port each packet switch sends it out of.

The controller knows each NIC's switch and port from the rack file and the circuits, so it
needs no flooding and no learning: every switch gets one rule per NIC address (IPv4 by
destination, ARP by target address), pointing down a downlink or along the shortest uplink path.
"""
from __future__ import annotations

from collections import deque

from controller.core.circuits import CircuitMap
from controller.core.rack import Rack

Table = dict[str, int]  # NIC IPv4 address -> output port



def switch_links(rack: Rack) -> dict[str, dict[str, int]]:
    """switch -> {neighbour switch: local uplink port} (the first port, if several)."""
    links: dict[str, dict[str, int]] = {w: {} for w in rack.switches}
    for w in rack.spec.switches:
        for u in sorted(w.uplinks, key=lambda u: u.port):
            links[w.name].setdefault(u.peer.device, u.port)
    return links


def next_hop_ports(rack: Rack) -> dict[str, dict[str, int]]:
    """src switch -> {dst switch: port on src toward dst}: breadth-first, ties to the lowest port."""
    links = switch_links(rack)
    result: dict[str, dict[str, int]] = {}
    for src in links:
        first: dict[str, int] = {}
        queue: deque[str] = deque()
        for n, port in sorted(links[src].items(), key=lambda x: x[1]):
            if n not in first:
                first[n] = port
                queue.append(n)
        while queue:
            s = queue.popleft()
            for n in sorted(links[s], key=lambda k: links[s][k]):
                if n != src and n not in first:
                    first[n] = first[s]
                    queue.append(n)
        result[src] = first
    return result


def compute_tables(rack: Rack, circuits: CircuitMap, gpus: set[str] | None = None) -> dict[str, Table]:
    """The forwarding table of every packet switch for the NICs of `gpus` (default: every GPU with a circuit)."""
    hops = next_hop_ports(rack)
    where = circuits.gpu_locations(rack)
    tables: dict[str, Table] = {w: {} for w in rack.switches}
    for gpu, (switch, port) in sorted(where.items()):
        if gpus is not None and gpu not in gpus:
            continue
        ip = rack.addresses[gpu][0]
        for w in tables:
            if w == switch:
                tables[w][ip] = port
            elif switch in hops.get(w, {}):
                tables[w][ip] = hops[w][switch]
    return tables



def path(rack: Rack, circuits: CircuitMap, src_gpu: str, dst_gpu: str) -> list[str]:
    """The packet switches a packet from one GPU's NIC to another's crosses (for tests and reports)."""
    where = circuits.gpu_locations(rack)
    if src_gpu not in where or dst_gpu not in where:
        return []
    hops = next_hop_ports(rack)
    links = switch_links(rack)
    at, goal, route = where[src_gpu][0], where[dst_gpu][0], [where[src_gpu][0]]
    while at != goal:
        port = hops[at][goal]
        at = next(n for n, p in links[at].items() if p == port)
        route.append(at)
    return route


"""The rack's in-network aggregators: where each is (a port of its switch, an address on the rack's network), the
checks of the rack file that need the whole rack, and the forwarding entries that reach them.

An aggregator stands for the aggregation engine inside its switch (containers/aggregator.py runs it); the emulated
rack attaches it to its switch's port unshaped. Every switch forwards the aggregator's address (IPv4 and ARP) as it
forwards a GPU NIC's: down the aggregator's port on its own switch, along the shortest uplink path elsewhere. Its
address never moves: circuits change where GPUs are, not where an aggregator is.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from controller.core.circuits import CircuitMap
from controller.core.forwarding import Table, compute_tables, next_hop_ports
from controller.core.rack import Rack, RackError


@dataclass(frozen=True)
class Aggregator:
    switch: str
    port: int
    ip: str
    udp_port: int
    jobs: int
    capacity_bytes: int

    @property
    def address(self) -> str:
        """HOST:PORT, as the worker's --aggregator takes it."""
        return f"{self.ip}:{self.udp_port}"

    @property
    def node(self) -> str:
        """The emulated rack's name for it (its namespace is optirack-<node>)."""
        return f"{self.switch}-agg"


def aggregators(rack: Rack) -> list[Aggregator]:
    """The rack file's aggregators, in the order of their switches."""
    return [Aggregator(w.name, w.aggregator.port, str(w.aggregator.ip), w.aggregator.udp_port, w.aggregator.jobs,
                       w.aggregator.capacity_bytes) for w in rack.spec.switches if w.aggregator is not None]


def check(rack: Rack) -> None:
    """Refuse an aggregator's address outside network.subnet, or one a GPU NIC or another aggregator has."""
    subnet = rack.spec.network.subnet
    taken = {ip: f"the NIC of {gpu}" for gpu, (ip, _) in rack.addresses.items()}
    for i, w in enumerate(rack.spec.switches):
        if w.aggregator is None:
            continue
        ip, field = str(w.aggregator.ip), f"switches[{i}].aggregator.ip"
        if ipaddress.IPv4Address(ip) not in subnet or ip in (str(subnet.network_address),
                                                              str(subnet.broadcast_address)):
            raise RackError(rack.source, field, f"{ip} is not a host address of network.subnet {subnet}")
        if ip in taken:
            raise RackError(rack.source, field, f"{ip} is also {taken[ip]}")
        taken[ip] = f"the aggregator of {w.name}"


def routes(rack: Rack) -> dict[str, Table]:
    """Every switch's entries for the aggregators' addresses: address -> output port."""
    hops = next_hop_ports(rack)
    tables: dict[str, Table] = {w: {} for w in rack.switches}
    for a in aggregators(rack):
        for w, table in tables.items():
            if w == a.switch:
                table[a.ip] = a.port
            elif a.switch in hops.get(w, {}):
                table[a.ip] = hops[w][a.switch]
    return tables


def tables(rack: Rack, circuits: CircuitMap) -> dict[str, Table]:
    """What every switch holds: its entries for the GPU NICs where the circuits put them, and the aggregators'."""
    result = compute_tables(rack, circuits)
    for w, table in routes(rack).items():
        result[w].update(table)
    return result

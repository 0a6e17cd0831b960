"""Forwarding tables: following them hop by hop from any NIC delivers to the right NIC's port."""
import random

from controller.core.circuits import CircuitMap
from controller.core.forwarding import compute_tables, next_hop_ports, path, switch_links
from controller.core.rack import load_rack
from tests.unit.test_rack import ROOT

PAPER = load_rack(ROOT / "topologies" / "paper-testbed.yaml")
RACK8 = load_rack(ROOT / "topologies" / "rack8-3as.yaml")


def deliver(rack, circuits, src_gpu, dst_gpu):
    """Walk the tables from the source NIC's switch; return the (switch, port) the packet leaves by."""
    tables = compute_tables(rack, circuits)
    where = circuits.gpu_locations(rack)
    peers = {(w.name, u.port): u.peer.device for w in rack.spec.switches for u in w.uplinks}
    at, ip = where[src_gpu][0], rack.addresses[dst_gpu][0]
    for _ in range(len(rack.switches) + 1):
        port = tables[at].get(ip)
        if port is None:
            return None
        if (at, port) not in peers:
            return at, port
        at = peers[(at, port)]
    raise AssertionError("forwarding loop")


def random_circuits(rack, rng):
    downlinks = [d.ocs_port for w in rack.spec.switches for d in w.downlinks]
    rng.shuffle(downlinks)
    gpus = list(rack.gpus)
    rng.shuffle(gpus)
    keep = gpus[: rng.randint(2, len(gpus))]
    return CircuitMap((rack.gpu_port(g), downlinks[i]) for i, g in enumerate(keep))


def test_every_pair_is_delivered_under_random_circuits():
    rng = random.Random(7)
    for rack in (PAPER, RACK8):
        for _ in range(50):
            circuits = random_circuits(rack, rng)
            where = circuits.gpu_locations(rack)
            for src in where:
                for dst in rack.gpus:
                    got = deliver(rack, circuits, src, dst)
                    assert got == (where[dst] if dst in where else None)


def test_tables_have_one_entry_per_connected_nic_and_nothing_else():
    circuits = CircuitMap.initial(PAPER)
    tables = compute_tables(PAPER, circuits)
    assert tables["as1"] == {"198.18.0.1": 1, "198.18.0.2": 2, "198.18.0.3": 3,
                             "198.18.0.4": 10, "198.18.0.5": 10, "198.18.0.6": 10}
    only = compute_tables(PAPER, circuits, gpus={"gpu1"})
    assert only["as2"] == {"198.18.0.1": 10}


def test_paths_and_hops():
    c = CircuitMap.initial(RACK8)
    assert path(RACK8, c, "gpu1", "gpu7") == ["as1", "core", "as3"]
    assert path(RACK8, c, "gpu1", "gpu2") == ["as1"]
    assert next_hop_ports(RACK8)["core"] == {"as1": 1, "as2": 2, "as3": 3}
    assert switch_links(PAPER) == {"as1": {"as2": 10}, "as2": {"as1": 10}}


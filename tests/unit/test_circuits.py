"""The circuit map: validation against the rack, diffs, and where each GPU ends up."""
import pytest

from controller.core.cabling import CircuitError
from controller.core.circuits import CircuitMap
from controller.core.rack import PortRef, load_rack
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)


def cm(*pairs):
    return CircuitMap.parse(RACK, [list(p) for p in pairs])


def test_initial_map_and_locations():
    m = CircuitMap.initial(RACK)
    assert len(m) == 6
    assert m.partner(PortRef("ocs1", 1)) == PortRef("ocs1", 11)
    assert m.partner(PortRef("ocs1", 11)) == PortRef("ocs1", 1)
    assert m.gpu_locations(RACK) == {"gpu1": ("as1", 1), "gpu5": ("as1", 2), "gpu2": ("as1", 3),
                                     "gpu3": ("as2", 1), "gpu6": ("as2", 2), "gpu4": ("as2", 3)}


def test_diff_touches_only_what_changes():
    old = cm(("ocs1:1", "ocs1:11"), ("ocs1:2", "ocs1:12"))
    new = cm(("ocs1:1", "ocs1:11"), ("ocs1:2", "ocs1:21"), ("ocs1:3", "ocs1:12"))
    d = old.diff(new)
    assert d.remove == {(PortRef("ocs1", 2), PortRef("ocs1", 12))}
    assert d.add == {(PortRef("ocs1", 2), PortRef("ocs1", 21)), (PortRef("ocs1", 3), PortRef("ocs1", 12))}
    assert old.apply(d) == new
    assert not new.diff(new)
    assert set(d.by_ocs()) == {"ocs1"}


def test_order_of_ports_does_not_matter():
    assert cm(("ocs1:11", "ocs1:1")) == cm(("ocs1:1", "ocs1:11"))
    assert cm(("ocs1:11", "ocs1:1")).to_json() == [["ocs1:1", "ocs1:11"]]


@pytest.mark.parametrize("items,field,problem", [
    ([["ocs1:1", "ocs1:2"]], "circuits[0]", "GPU NIC to GPU NIC"),
    ([["ocs1:11", "ocs1:21"]], "circuits[0]", "switch port to switch port"),
    ([["ocs1:1", "ocs1:11"], ["ocs1:1", "ocs1:12"]], "circuits[1]", "already used by circuits[0]"),
    ([["ocs1:1", "ocs1:40"]], "circuits[0]", "nothing is cabled"),
    ([["ocs1:1", "ocs1:400"]], "circuits[0]", "only 320 ports"),
    ([["ocs2:1", "ocs1:11"]], "circuits[0]", "no OCS named 'ocs2'"),
    ([["ocs1:1"]], "circuits[0]", "pair of ports"),
    ([["ocs1:1", "11"]], "circuits[0]", "device:port"),
    ({"a": 1}, "circuits", "list"),
])
def test_bad_circuits(items, field, problem):
    with pytest.raises(CircuitError) as info:
        CircuitMap.parse(RACK, items)
    assert info.value.field == field
    assert problem in info.value.problem


def test_rates_must_match():
    data = RACK.spec.model_dump(mode="json")
    data["servers"][0]["gpus"][0]["nic"]["rate_gbps"] = 25
    data["circuits"] = []
    from controller.core.rack import parse_rack
    rack = parse_rack(data)
    with pytest.raises(CircuitError, match="25 Gbit/s"):
        CircuitMap.parse(rack, [["ocs1:1", "ocs1:11"]])

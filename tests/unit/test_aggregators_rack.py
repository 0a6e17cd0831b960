"""A rack file's in-network aggregators (controller/core/aggregators.py): the field, its checks, its routes."""
from __future__ import annotations

import copy

import pytest
import yaml

from controller.cli import main as cli_main
from controller.core import aggregators
from controller.core.circuits import CircuitMap
from controller.core.forwarding import compute_tables
from controller.core.rack import RackError, load_rack, parse_rack
from tests.integration.helpers import PAPER

RACK = load_rack(PAPER)
DATA = yaml.safe_load(PAPER.read_text())


def test_the_paper_rack_has_one_aggregator_per_switch_and_every_switch_reaches_both():
    assert [(a.switch, a.port, a.address, a.jobs) for a in aggregators.aggregators(RACK)] == [
        ("as1", 20, "198.18.0.250:9999", 4), ("as2", 20, "198.18.0.251:9999", 4)]
    assert aggregators.routes(RACK) == {"as1": {"198.18.0.250": 20, "198.18.0.251": 10},
                                        "as2": {"198.18.0.250": 10, "198.18.0.251": 20}}
    circuits = CircuitMap.initial(RACK)
    tables, nics = aggregators.tables(RACK, circuits), compute_tables(RACK, circuits)
    for switch, table in tables.items():  # the NICs' entries as before, the aggregators' beside them
        assert {ip: p for ip, p in table.items() if not ip.startswith("198.18.0.25")} == nics[switch]
        assert table["198.18.0.250"] == aggregators.routes(RACK)[switch]["198.18.0.250"]


def _with(switch: int, **aggregator) -> dict:
    data = copy.deepcopy(DATA)
    data["switches"][switch]["aggregator"] = {**data["switches"][switch]["aggregator"], **aggregator}
    return data


@pytest.mark.parametrize("change,field,problem", [
    ({"port": 10}, "switches[0]", "aggregator.port 10 is also a downlink or uplink of as1"),
    ({"ip": "10.0.0.1"}, "switches[0].aggregator.ip", "not a host address of network.subnet 198.18.0.0/24"),
    ({"ip": "198.18.0.255"}, "switches[0].aggregator.ip", "not a host address"),
    ({"ip": "198.18.0.2"}, "switches[0].aggregator.ip", "is also the NIC of gpu5"),
    ({"ip": "198.18.0.251"}, "switches[1].aggregator.ip", "is also the aggregator of as1"),
    ({"jobs": 0}, "switches[0].aggregator.jobs", "greater than or equal to 1"),
])
def test_a_bad_aggregator_is_refused_by_field(change, field, problem, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_with(0, **change)))
    with pytest.raises(RackError) as info:
        aggregators.check(load_rack(path))
    assert info.value.field == field and problem in info.value.problem
    assert cli_main(["check-topology", str(path)]) == 2
    assert f"{field}: " in capsys.readouterr().err


def test_a_rack_without_aggregators_has_no_routes_for_them():
    data = copy.deepcopy(DATA)
    for w in data["switches"]:
        del w["aggregator"]
    rack = parse_rack(data)
    assert aggregators.aggregators(rack) == [] and aggregators.routes(rack) == {"as1": {}, "as2": {}}
    assert aggregators.tables(rack, CircuitMap.initial(rack)) == compute_tables(rack, CircuitMap.initial(rack))

"""Small wrappers over ovs-vsctl, ovs-ofctl and tc, always with argument lists."""
from __future__ import annotations

import json
import re

from emulation.netns import NetnsError, run

RACK_LABEL = "optirack-rack"  # external_ids key on every bridge a rack makes
NOT_RUNNING_HINT = "Open vSwitch is not running (its database refused ovs-vsctl): `make setup` starts it"


def vsctl(*args: str, check: bool = True) -> str:
    try:
        return run("ovs-vsctl", "--timeout=10", *args, check=check)
    except NetnsError as exc:
        if "database connection failed" in str(exc):
            raise NetnsError(f"{NOT_RUNNING_HINT}; {exc}") from exc
        raise


def _table(table: str, columns: list[str]) -> list[dict]:
    out = json.loads(vsctl("--format=json", f"--columns={','.join(columns)}", "list", table))
    return [dict(zip(out["headings"], (_ovs_value(v) for v in row), strict=True)) for row in out["data"]]


def _ovs_value(value):
    if isinstance(value, list) and value and value[0] == "map":
        return {k: _ovs_value(v) for k, v in value[1]}
    if isinstance(value, list) and value and value[0] == "set":
        return [_ovs_value(v) for v in value[1]]
    if isinstance(value, list) and value and value[0] == "uuid":
        return value[1]
    return value


def bridges() -> dict[str, dict]:
    """Every bridge: name -> {external_ids, ports (uuids), controller (uuids), ...}."""
    return {b["name"]: b for b in _table("Bridge", ["name", "external_ids", "ports", "controller", "fail_mode",
                                                     "protocols", "datapath_type", "other_config"])}


def rack_bridges() -> dict[str, str]:
    """Bridges made by a rack: name -> rack name."""
    return {name: b["external_ids"][RACK_LABEL] for name, b in bridges().items()
            if isinstance(b["external_ids"], dict) and RACK_LABEL in b["external_ids"]}


def bridge_ports(bridge: str) -> dict[str, int]:
    """Interface name -> OpenFlow port number, for the ports of one bridge (not the bridge itself)."""
    names = vsctl("list-ports", bridge).split()
    if not names:
        return {}
    ofports = {i["name"]: i["ofport"] for i in _table("Interface", ["name", "ofport"])}
    return {n: ofports.get(n, -1) for n in names}


def controller_connected(bridge: str) -> bool:
    return vsctl("--if-exists", "get", "controller", bridge, "is_connected", check=False).strip() == "true"


def ofctl(*args: str, check: bool = True) -> str:
    return run("ovs-ofctl", "-O", "OpenFlow13", *args, check=check)


_FLOW = re.compile(r"in_port=\"?(\d+)\"?.*actions=output:\"?(\d+)\"?")


def circuit_flows(bridge: str) -> set[tuple[int, int]]:
    """The OCS bridge's port-to-port flows as (in_port, out_port) pairs."""
    return flow_pairs(ofctl("dump-flows", bridge))


def flow_pairs(dump: str) -> set[tuple[int, int]]:
    """(in_port, out_port) pairs of port-to-port flows in `ovs-ofctl dump-flows` output."""
    pairs = set()
    for line in dump.splitlines():
        m = _FLOW.search(line)
        if m:
            pairs.add((int(m.group(1)), int(m.group(2))))
    return pairs


def circuits_of(pairs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Bidirectional flow pairs -> circuits (a, b) with a < b; one-way leftovers are ignored."""
    return {(min(a, b), max(a, b)) for a, b in pairs if (b, a) in pairs}


_RATE = re.compile(r"class htb 5:1 root .*?rate (\d+(?:\.\d+)?)([KMG]?)bit")


def shaped_mbps(intf: str, netns: str | None = None) -> float | None:
    """The htb rate on an interface, in Mbit/s, or None if it is not shaped."""
    cmd = ["tc"] + (["-n", netns] if netns else []) + ["class", "show", "dev", intf]
    m = _RATE.search(run(*cmd, check=False))
    if not m:
        return None
    unit = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}[m.group(2)]
    return float(m.group(1)) * unit


def circuit_cookie(port: int) -> int:
    """The cookie of an emulated OCS's circuit flow out of `port`, as the controller sets it (the OCS tag 0x0c, the
    in_port above it: controller.drivers.openflow.circuit_cookie; a unit test checks the two agree)."""
    return 0x0C | port << 8

"""A bare rack: the rack's Open vSwitch bridges without servers, for the control plane at scale.

The OCS and packet-switch bridges are made exactly as `emulation.rack` makes them (userspace
datapath, OpenFlow 1.3, fail-mode secure, the rack's datapath ids, labelled, OCS port numbers as
OpenFlow port numbers, aggregator downlinks cabled by patch ports), so the controller drives
them through its real path. What is left out is what costs minutes at hundreds of GPUs: the
servers' namespaces, veth NICs and shaping. Each GPU NIC is a patch port on the OCS whose peer
sits on one stub bridge; uplinks between switches are patch pairs. No packet ever has to cross
it: it is for measuring reconfiguration, not traffic. `emulation.rack.down` removes it.
"""
from __future__ import annotations

import time

from controller.core.emulated import port_intf
from controller.core.rack import Rack
from emulation import ovs
from emulation.rack import RackConflict, RackState, down, start_netconf
from emulation.topo import downlink_patches


def stub_bridge(rack: Rack) -> str:
    """The bridge holding the GPU NICs' peers (a '-' keeps it apart from any device the rack file names)."""
    return f"{rack.name}-nics"


def _bridge(name: str, dpid: int | None, rack: str, controller: str) -> list[str]:
    args = ["--", "add-br", name, "--", "set", "bridge", name, "datapath_type=netdev", "protocols=OpenFlow13",
            "fail_mode=secure", "other-config:disable-in-band=true", f"external-ids:{ovs.RACK_LABEL}={rack}"]
    if dpid is not None:  # as Mininet's OVSSwitch does: reconnect within a second
        ref = f"@c_{name.replace('-', '_')}"
        args += [f"other-config:datapath-id={dpid:016x}", "--", f"--id={ref}", "create", "controller",
                 f"target=\"tcp:{controller}\"", "max_backoff=1000", "--", "set", "bridge", name, f"controller={ref}"]
    return args


def _patch(bridge: str, name: str, peer: str, ofport: int | None) -> list[str]:
    args = ["--", "add-port", bridge, name, "--", "set", "interface", name, "type=patch", f"options:peer={peer}"]
    return args + ([f"ofport_request={ofport}"] if ofport else [])


def bridge_commands(rack: Rack, controller: str) -> list[str]:
    """One ovs-vsctl transaction that makes every bridge and port of the bare rack."""
    args: list[str] = []
    for o in rack.spec.ocs:
        args += _bridge(o.name, o.dpid, rack.name, controller)
    for w in rack.spec.switches:
        args += _bridge(w.name, w.dpid, rack.name, controller)
    stub = stub_bridge(rack)
    args += _bridge(stub, None, rack.name, controller)
    for name, gpu in rack.gpus.items():
        ref = gpu.nic.ocs_port
        args += _patch(ref.device, port_intf(ref.device, ref.port), f"nic-{name}", ref.port)
        args += _patch(stub, f"nic-{name}", port_intf(ref.device, ref.port), None)
    done = set()
    for w in rack.spec.switches:
        for u in w.uplinks:
            key = frozenset([(w.name, u.port), (u.peer.device, u.peer.port)])
            if key not in done:
                done.add(key)
                a, b = port_intf(w.name, u.port), port_intf(u.peer.device, u.peer.port)
                args += _patch(w.name, a, b, u.port) + _patch(u.peer.device, b, a, u.peer.port)
    return args + downlink_patches(rack)


def up_bare(rack: Rack, controller: str = "127.0.0.1:6653", wait_connected: float = 5.0) -> RackState:
    """Make the bare rack (taking down any rack that is up) and wait for the controller connections."""
    t0 = time.monotonic()
    if RackState.load() or ovs.rack_bridges():
        print("a rack (or what is left of one) is up: taking it down first", flush=True)
        down()
    names = [o.name for o in rack.spec.ocs] + [w.name for w in rack.spec.switches] + [stub_bridge(rack)]
    clash = [n for n in names if n in ovs.bridges()]
    if clash:
        raise RackConflict(f"an Open vSwitch bridge named {clash[0]!r} exists and was not made by optirack")
    state = RackState(name=rack.name, rack_file=str(rack.source), controller=controller, bridges=names,
                      root_intfs=[], namespaces={})
    state.save()  # before anything exists, so that `down` can clean up after a failure here
    try:
        ovs.run("ovs-vsctl", "--timeout=120", *bridge_commands(rack, controller))
        start_netconf(rack, state)
    except BaseException:
        down(quiet=True)
        raise
    state.status, state.up_seconds = "up", round(time.monotonic() - t0, 2)
    state.save()
    deadline = time.monotonic() + wait_connected
    while time.monotonic() < deadline and not all(ovs.controller_connected(b) for b in names[:-1]):
        time.sleep(0.2)
    return state

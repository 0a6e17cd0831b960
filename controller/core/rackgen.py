"""Generated racks of any size, for tests, benchmarks and studies beyond the paper's testbed.

Layout: `servers` servers of `gpus_per_server` GPUs; `switches` aggregator switches joined by a
core switch; `ocs` optical switches. GPUs are spread round-robin over the OCS, and every
aggregator has `downlinks` ports on every OCS, so any GPU can be brought under any aggregator.
Starting circuits are server-centric: consecutive GPUs fill one aggregator after another.
`models` mixes GPU models: server i gets models[i % len(models)].
"""
from __future__ import annotations

from collections.abc import Sequence

from controller.core.rack import Rack, parse_rack


def dpid_bases(switches: int, ocs: int) -> tuple[int, int, int]:
    """Datapath id bases of the OCS, the aggregators and the core switch, which never collide:
    0x100 + o, 0x200 + w and 0x300 while under 255 of each (the paper testbed's numbering), else
    one 2**32-wide range per kind."""
    if switches < 255 and ocs < 255:
        return 0x100, 0x200, 0x300
    return 1 << 32, 2 << 32, 3 << 32


def rack_spec(gpus: int, gpus_per_server: int = 4, switches: int = 4, ocs: int = 1, model: str = "V100",
              nic_gbps: float = 100.0, uplink_gbps: float = 100.0, rate_scale: float = 0.0005, name: str = "gen",
              spare: float = 1.0, models: Sequence[str] = ()) -> dict:
    """A rack file as a dict. `spare` scales each aggregator's downlinks above an even share."""
    if gpus % gpus_per_server or gpus % ocs:
        raise ValueError("gpus must be a multiple of gpus_per_server and of ocs")
    # every aggregator needs a port on every OCS for each of its starting GPUs there, spare on top
    per_switch_per_ocs = max(1, -(-gpus // (switches * ocs)), round(gpus / switches / ocs * spare))
    ocs_base, switch_base, core_dpid = dpid_bases(switches, ocs)
    gpu_ports = gpus // ocs
    ports = gpu_ports + switches * per_switch_per_ocs
    models = list(models) or [model]
    servers = []
    for s in range(gpus // gpus_per_server):
        servers.append({"name": f"s{s + 1}", "gpus": [
            {"name": f"g{g + 1}", "model": models[s % len(models)], "index": g - s * gpus_per_server,
             "nic": {"rate_gbps": nic_gbps, "ocs_port": f"o{g % ocs + 1}:{g // ocs + 1}"}}
            for g in range(s * gpus_per_server, (s + 1) * gpus_per_server)]})
    sw = []
    for w in range(switches):
        downlinks: list[dict] = []
        for o in range(ocs):
            for d in range(per_switch_per_ocs):
                downlinks.append({"port": len(downlinks) + 1, "rate_gbps": nic_gbps,
                                  "ocs_port": f"o{o + 1}:{gpu_ports + w * per_switch_per_ocs + d + 1}"})
        sw.append({"name": f"a{w + 1}", "dpid": switch_base + w + 1, "downlinks": downlinks,
                   "uplinks": [{"port": 9000, "peer": f"core:{w + 1}", "rate_gbps": uplink_gbps}]})
    sw.append(
        {
            "name": "core",
            "dpid": core_dpid,
            "role": "core",
            "uplinks": [{"port": w + 1, "peer": f"a{w + 1}:9000", "rate_gbps": uplink_gbps} for w in range(switches)],
        }
    )
    circuits: list[list[str]] = []
    used: dict[tuple[int, int], int] = {}
    for g in range(gpus):
        o = g % ocs
        w = min(g * switches // gpus, switches - 1)
        k = used.get((w, o), 0)
        if k < per_switch_per_ocs:
            used[(w, o)] = k + 1
            circuits.append([f"o{o + 1}:{g // ocs + 1}", f"o{o + 1}:{gpu_ports + w * per_switch_per_ocs + k + 1}"])
    return {
        "name": name[:9],
        "description": f"generated: {gpus} x {'/'.join(models)}, {switches} aggregators, {ocs} OCS",
        "network": {"subnet": "198.18.0.0/15" if gpus > 250 else "198.18.0.0/24"},
        "emulation": {"rate_scale": rate_scale},
        "servers": servers,
        "ocs": [
            {"name": f"o{o + 1}", "ports": ports, "dpid": ocs_base + o + 1, "switching_time_ms": 25} for o in range(ocs)
        ],
        "switches": sw,
        "circuits": circuits,
    }


def generate(gpus: int, **kw) -> Rack:
    return parse_rack(rack_spec(gpus, **kw), f"<generated {gpus} GPUs>")

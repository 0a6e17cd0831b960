"""JSON views of the controller's state for the REST API (no Ryu, no I/O)."""
from __future__ import annotations

from controller.apps.context import Optirack
from controller.core.circuits import CircuitMap
from controller.core.errors import Conflict


def topology(ctx: Optirack) -> dict:
    rack = ctx.rack
    where = ctx.circuits.gpu_locations(rack)
    jobs = ctx.jobs.busy_gpus()
    down = ctx.jobs.down_servers()
    gpus = {}
    for name, g in rack.gpus.items():
        ip, mac = rack.addresses[name]
        switch = where.get(name)
        gpus[name] = {"model": g.model, "server": rack.server_of[name], "index": g.index, "ip": ip, "mac": mac,
                      "rate_gbps": g.nic.rate_gbps, "ocs_port": str(g.nic.ocs_port),
                      "switch": None if switch is None else {"name": switch[0], "port": switch[1]},
                      "job": jobs.get(name)}
    return {
        "rack": rack.name,
        "description": rack.spec.description,
        "fragmentation": ctx.jobs.fragmentation(),
        "rate_scale": rack.spec.emulation.rate_scale,
        "servers": {
            s.name: {
                "docker": s.docker,
                "gpus": [g.name for g in s.gpus],
                "engine": {"up": s.name not in down, "reason": down.get(s.name)},
            }
            for s in rack.spec.servers
        },
        "gpus": gpus,
        "ocs": {
            o.name: {
                "dpid": f"{o.dpid:#x}",
                "ports": o.ports,
                "driver": o.driver,
                "switching_time_ms": o.switching_time_ms,
                "reconfiguration_time_ms": o.bulk_time_ms,
                **_device_status(ctx, o.name),
                "synchronised": o.name in ctx.ocs.synchronised,
            }
            for o in rack.spec.ocs
        },
        "switches": {
            w.name: {
                "dpid": f"{w.dpid:#x}",
                "role": w.role,
                "connected": ctx.connected(w.name),
                "synchronised": w.name in ctx.fabric.installed,
                "downlinks": [
                    {"port": d.port, "ocs_port": str(d.ocs_port), "rate_gbps": d.rate_gbps} for d in w.downlinks
                ],
                "uplinks": [{"port": u.port, "peer": str(u.peer), "rate_gbps": u.rate_gbps} for u in w.uplinks],
            }
            for w in rack.spec.switches
        },
    }


def _device_status(ctx: Optirack, name: str) -> dict:
    """connected, last_seen and error as the driver last knew them: a status read never talks to the device."""
    return ctx.ocs.drivers[name].status()


def circuits(ctx: Optirack, device: bool = False) -> dict:
    body = {
        "circuits": ctx.circuits.to_json(),
        "version": ctx.circuits_version,
        "by_ocs": {o: CircuitMap(ctx.circuits.on(o)).to_json() for o in ctx.rack.ocs},
    }
    if device:
        body["device"] = ctx.ocs.device_circuits()
    return body


def check_protected(ctx: Optirack, current: CircuitMap, target: CircuitMap) -> None:
    """Refuse a circuit change that would cut an active job's GPU off its switch (call it under the lock)."""
    protected = ctx.protected_ports(current)
    diff = current.diff(target)
    for a, b in sorted(diff.remove):
        for ref in (a, b):
            if ref in protected:
                raise Conflict(f"circuit {a}-{b} carries job {protected[ref]}; stop or regroup that job instead")


def port_stats(ctx: Optirack, history: int = 0) -> dict:
    datapaths: dict[str, dict[str, dict]] = {}
    for dpid, port in ctx.ports.ports():
        latest = ctx.ports.latest(dpid, port)
        if latest is not None:
            datapaths.setdefault(ctx.name_of(dpid), {})[str(port)] = latest.to_json()
    gpus = {}
    for name, g in ctx.rack.gpus.items():
        ref = g.nic.ocs_port
        dpid = ctx.rack.ocs[ref.device].dpid
        latest = ctx.ports.latest(dpid, ref.port)
        # Seen from the OCS port facing the NIC: what the OCS receives, the NIC sent.
        entry: dict[str, object] = {
            "ocs_port": str(ref),
            "tx_bps": latest.rx_bps if latest else None,
            "rx_bps": latest.tx_bps if latest else None,
            "t": latest.t if latest else None,
        }
        if history:
            entry["history"] = [
                {"t": round(s.t, 3), "tx_bps": round(s.rx_bps), "rx_bps": round(s.tx_bps)}
                for s in ctx.ports.history(dpid, ref.port, history)
            ]
        gpus[name] = entry
    return {"datapaths": datapaths, "gpus": gpus}

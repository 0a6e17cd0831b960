"""Placement policies: which GPUs a job gets and which circuits put them where.

- fixed: the server-centric baseline. Free GPUs in rack order, today's cabling kept, so a job's
  GPUs can sit under different aggregator switches.
- regroup: bring all of a job's GPUs under one aggregator switch with the fewest circuit
  changes, never touching a circuit of another running job; when no switch has room, say so
  and use the fewest switches.

Plans are pure: they take the rack, the current circuits and the ports other jobs hold, and
return the target circuits. Ranks are ordered switch by switch, so a ring crosses switches as
few times as it can.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controller.core.circuits import CircuitMap, normalize
from controller.core.rack import PortRef, Rack


class PlacementError(ValueError):
    """No placement exists for the request; the message says why."""


@dataclass(frozen=True)
class Plan:
    gpus: tuple[str, ...]  # in rank order
    target: CircuitMap
    switches: tuple[str, ...]  # aggregator switches the job's GPUs end under
    changes: int  # circuits removed + added
    note: str = ""


def free_gpus(rack: Rack, busy: Iterable[str]) -> list[str]:
    busy = set(busy)
    return [g for g in rack.gpus if g not in busy]


def _rank_order(rack: Rack, circuits: CircuitMap, gpus: Iterable[str]) -> tuple[str, ...]:
    where = circuits.gpu_locations(rack)
    order = {name: i for i, name in enumerate(rack.gpus)}
    switch_order = {name: i for i, name in enumerate(rack.switches)}
    return tuple(sorted(gpus, key=lambda g: (switch_order.get(where.get(g, ("~", 0))[0], 1 << 30), order[g])))


def _switches_of(rack: Rack, circuits: CircuitMap, gpus: Iterable[str]) -> tuple[str, ...]:
    where = circuits.gpu_locations(rack)
    return tuple(sorted({where[g][0] for g in gpus if g in where}, key=list(rack.switches).index))


def plan_fixed(rack: Rack, circuits: CircuitMap, gpus: list[str]) -> Plan:
    """Keep the cabling; every GPU must already have a circuit to a switch."""
    where = circuits.gpu_locations(rack)
    missing = [g for g in gpus if g not in where]
    if missing:
        raise PlacementError(f"{', '.join(missing)} has no circuit to a switch; the fixed policy keeps the cabling "
                             "as it is (use policy 'regroup', or set circuits first)")
    return Plan(_rank_order(rack, circuits, gpus), circuits, _switches_of(rack, circuits, gpus), 0)


def pick_gpus(rack: Rack, circuits: CircuitMap, busy: Iterable[str], n: int, policy: str) -> list[str]:
    """`n` free GPUs: in rack order for 'fixed'; for 'regroup', those under the switch that
    already has the most free GPUs first (fewer circuits to change), then in rack order."""
    free = free_gpus(rack, busy)
    if n > len(free):
        raise PlacementError(f"{n} GPUs asked for, {len(free)} free")
    if policy == "fixed":
        connected = [g for g in free if g in circuits.gpu_locations(rack)]
        if n > len(connected):
            raise PlacementError(f"{n} GPUs asked for, {len(connected)} free GPUs have circuits (fixed keeps the cabling)")
        return connected[:n]
    where = circuits.gpu_locations(rack)
    per_switch: dict[str, list[str]] = {}
    for g in free:
        if g in where:
            per_switch.setdefault(where[g][0], []).append(g)
    best = max(per_switch.values(), key=len, default=[])
    chosen = best[:n]
    chosen += [g for g in free if g not in chosen][: n - len(chosen)]
    return chosen


def _free_downlinks(rack: Rack, circuits: CircuitMap, switch: str, protected: set[PortRef], job_ports: set[PortRef]):
    """Downlinks of `switch` a job may take: unused, used by an idle GPU, or used by the job itself."""
    result = []
    for ref in rack.downlink_ports(switch):
        if ref in protected:
            continue
        other = circuits.partner(ref)
        if other is None or other not in protected or other in job_ports:
            result.append(ref)
    return result


def _assign(rack: Rack, circuits: CircuitMap, gpus: list[str], switch: str, protected: set[PortRef],
            where: dict[str, tuple[str, int]]):
    """Put as many of `gpus` under `switch` as fit; return placed gpu -> downlink."""
    job_ports = {rack.gpu_port(g) for g in gpus}
    placed: dict[str, PortRef] = {}
    for g in gpus:  # GPUs already there stay where they are
        if where.get(g, ("", 0))[0] == switch:
            placed[g] = circuits.partner(rack.gpu_port(g))
    taken = set(placed.values())
    candidates = [d for d in _free_downlinks(rack, circuits, switch, protected, job_ports) if d not in taken]
    # unused downlinks first, then those of idle GPUs (whose circuits must go)
    candidates.sort(key=lambda d: circuits.partner(d) is not None)
    for g in gpus:
        if g in placed:
            continue
        ocs = rack.gpu_port(g).device
        rate = rack.gpus[g].nic.rate_gbps
        pick = next((d for d in candidates if d.device == ocs and rack.endpoints[d].rate_gbps == rate), None)
        if pick is not None:
            placed[g] = pick
            candidates.remove(pick)
    return placed


def _changes(rack: Rack, circuits: CircuitMap, placed: dict[str, PortRef]) -> int:
    """Circuits removed plus added if `placed` were applied (without building the new map)."""
    removed, added = set(), 0
    for g, d in placed.items():
        gp = rack.gpu_port(g)
        if circuits.partner(gp) == d:
            continue
        added += 1
        for ref in (gp, d):
            other = circuits.partner(ref)
            if other is not None:
                removed.add(normalize(ref, other))
    return len(removed) + added


def _apply(rack: Rack, circuits: CircuitMap, placed: dict[str, PortRef]) -> CircuitMap:
    drop = set()
    for g, d in placed.items():
        gp = rack.gpu_port(g)
        for ref in (gp, d):
            other = circuits.partner(ref)
            if other is not None:
                drop.add(normalize(ref, other))
    keep = [c for c in circuits.circuits if c not in drop]
    return CircuitMap(keep + [normalize(rack.gpu_port(g), d) for g, d in placed.items()])


def plan_regroup(rack: Rack, circuits: CircuitMap, gpus: list[str], protected: Iterable[PortRef] = ()) -> Plan:
    """All of `gpus` under one aggregator switch with the fewest circuit changes, else the fewest switches."""
    protected = set(protected) - {rack.gpu_port(g) for g in gpus}
    protected |= {circuits.partner(p) for p in list(protected) if circuits.partner(p)}
    where = circuits.gpu_locations(rack)
    best = None
    for i, switch in enumerate(rack.aggregators()):
        placed = _assign(rack, circuits, gpus, switch, protected, where)
        if len(placed) < len(gpus):
            continue
        cost = (_changes(rack, circuits, placed), i)
        if best is None or cost < best[0]:
            best = (cost, switch, placed)
    if best is not None:
        (changes, _), switch, placed = best
        target = _apply(rack, circuits, placed)
        return Plan(_rank_order(rack, target, gpus), target, (switch,), changes)
    return _plan_fewest_switches(rack, circuits, gpus, protected)


def _plan_fewest_switches(rack: Rack, circuits: CircuitMap, gpus: list[str], protected: set[PortRef]) -> Plan:
    """Greedy: fill the switch that can take the most of the remaining GPUs, then the next."""
    remaining, current, used = list(gpus), circuits, []
    while remaining:
        options = []
        where_now = current.gpu_locations(rack)
        for switch in rack.aggregators():
            if switch in used:
                continue
            placed = _assign(rack, current, remaining, switch, protected, where_now)
            if placed:
                options.append((len(placed), -list(rack.switches).index(switch), switch, placed))
        if not options:
            raise PlacementError(f"no free downlink can take {', '.join(remaining)} (every switch port is held by "
                                 "other jobs)")
        _, _, switch, placed = max(options, key=lambda o: (o[0], o[1]))
        current = _apply(rack, current, placed)
        used.append(switch)
        remaining = [g for g in remaining if g not in placed]
    diff = circuits.diff(current)
    note = (f"no single aggregator switch has room for {len(gpus)} GPUs; spread over {len(used)}: {', '.join(used)}")
    return Plan(_rank_order(rack, current, gpus), current, tuple(used), len(diff.remove) + len(diff.add), note)


def plan(rack: Rack, circuits: CircuitMap, gpus: list[str], policy: str, protected: Iterable[PortRef] = ()) -> Plan:
    if policy == "fixed":
        return plan_fixed(rack, circuits, gpus)
    if policy == "regroup":
        return plan_regroup(rack, circuits, gpus, protected)
    raise PlacementError(f"unknown policy {policy!r} (fixed, regroup)")

"""The one place the simulator calls controller.core.placement: the controller's own decisions.

Today's API (controller/core/placement.py): `pick_gpus` chooses a job's GPUs, `plan` its
circuits under the job's policy, `plan_regroup` a running job's move. Which ports count as
another job's (and may not be touched) follows the placement app (controller/apps/placement.py:
`protected_ports`). A job that cannot be placed now waits, first come first served, as the
controller's queue will (issue #13).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from controller.core import placement as core
from controller.core.circuits import CircuitMap
from controller.core.rack import PortRef, Rack


class _Map(CircuitMap):
    """A circuit map that remembers where its GPUs are: the map is immutable, so the answer is too,
    and today's `pick_gpus` asks once per free GPU."""

    @cached_property
    def _where(self):
        return {}

    def gpu_locations(self, rack: Rack) -> dict[str, tuple[str, int]]:
        key = id(rack)
        if key not in self._where:
            self._where[key] = super().gpu_locations(rack)
        return self._where[key]


@dataclass(frozen=True)
class Placement:
    gpus: tuple[str, ...]  # rank order
    circuits: CircuitMap  # the whole map after the change
    switches: tuple[str, ...]
    note: str = ""


def own_map(circuits: CircuitMap) -> CircuitMap:
    """The same map, remembering its GPUs' locations (its state is shared, not rebuilt)."""
    if isinstance(circuits, _Map):
        return circuits
    wrapped = object.__new__(_Map)
    wrapped.__dict__.update(circuits.__dict__)
    wrapped.__dict__.pop("_where", None)
    return wrapped


def ports(rack: Rack, circuits: CircuitMap, gpus: Iterable[str]) -> set[PortRef]:
    """What a job protects from other jobs' plans: its GPUs' OCS ports and the other ends of their circuits."""
    out = set()
    for g in gpus:
        p = rack.gpu_port(g)
        out.add(p)
        other = circuits.partner(p)
        if other is not None:
            out.add(other)
    return out


def place(rack: Rack, circuits: CircuitMap, busy: set[str], protected: Iterable[PortRef], gpus: int,
          names: tuple[str, ...], policy: str) -> Placement | None:
    """Where a job goes now, or None when it must wait (too few free GPUs, or none placeable).
    `protected`: the ports of every other job (`ports`)."""
    circuits = own_map(circuits)
    if names:
        if busy.intersection(names):
            return None
        chosen = list(names)
    else:
        if gpus > len(rack.gpus) - len(busy):
            return None
        try:
            chosen = core.pick_gpus(rack, circuits, busy, gpus, policy)
        except core.PlacementError:
            return None
    try:
        p = core.plan(rack, circuits, chosen, policy, protected)
    except core.PlacementError:
        return None
    return Placement(p.gpus, own_map(p.target), p.switches, p.note)


def regroup(rack: Rack, circuits: CircuitMap, gpus: tuple[str, ...], protected: Iterable[PortRef]) -> Placement | None:
    """A running job's move under fewer switches, or None when its switch count would not fall.
    `protected`: the ports of every other job (`ports`)."""
    circuits = own_map(circuits)
    try:
        p = core.plan_regroup(rack, circuits, list(gpus), protected)
    except core.PlacementError:
        return None
    where = circuits.gpu_locations(rack)
    now = {where[g][0] for g in gpus if g in where}
    if len(p.switches) >= len(now) or p.target == circuits:
        return None
    return Placement(p.gpus, own_map(p.target), p.switches, p.note)

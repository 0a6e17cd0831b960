"""The one place the simulator calls controller.core.placement: the controller's own decisions.

`Placer` keeps what the controller keeps (the circuits, which job holds which GPUs) and asks
core for every decision. Two backends, chosen by what controller.core provides:
- the occupancy API (issue #13: `controller.core.occupancy.Occupancy`, `placement.plan` with a
  `Request`, `defrag.plan_defrag`): model-aware GPU choice, fewest switches then fewest circuit
  changes, and one joint defragmentation applied as one bulk change;
- today's API (`pick_gpus`, `plan`, `plan_regroup` on whole circuit maps): protected ports as
  the placement app computes them (`protected_ports`), and defragmentation as the app's
  `regroup_all` does it, job by job, largest first, one change each, keeping only moves that
  put a job under fewer switches.
A job that cannot be placed now waits (simulator/engine.py keeps the queue, first come first
served, as the controller's queue does).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from controller.core import placement as core
from controller.core.circuits import CircuitDiff, CircuitMap
from controller.core.rack import PortRef, Rack

try:  # issue #13's incremental placement state
    from controller.core import defrag as core_defrag
    from controller.core.occupancy import Occupancy
except ImportError:  # pragma: no cover - before issue #13 is merged
    Occupancy = None


class Unplaceable(ValueError):
    """A job that no state of the rack could ever place as asked; the message says why."""


@dataclass(frozen=True)
class Placement:
    gpus: tuple[str, ...]  # rank order
    switches: tuple[str, ...]
    diff: CircuitDiff  # what the OCS must change
    note: str = ""


@dataclass(frozen=True)
class Step:
    """One reconfiguration of a defragmentation round, and the jobs it moves."""

    diff: CircuitDiff
    moves: dict[str, Placement]  # job -> where it goes

class OccupancyPlacer:
    """Placement state of one simulated controller, in core's own incremental `Occupancy`."""

    def __init__(self, rack: Rack):
        self.rack = rack
        self.occ = Occupancy(rack, CircuitMap.initial(rack), {})
        self.gpus: dict[str, tuple[str, ...]] = {}  # job -> its GPUs in rank order

    def free(self) -> int:
        return sum(self.occ.free_model)

    def place(self, job: str, gpus: int, names: tuple[str, ...], policy: str, workload: str = "vgg16",
              gpu_model: str | None = None) -> Placement | None:
        """Place a new job and commit it, or None when it must wait."""
        if not names and gpus > self.free():
            return None
        try:
            p = core.plan(self.occ, core.Request(names or gpus, policy, gpu_model, workload))
        except core.NoRoomNow:
            return None
        except core.PlacementError as e:
            raise Unplaceable(f"job {job}: {e}") from None
        self.occ.apply(p.remove, p.add)
        self.occ.hold(job, p.gpus)
        self.gpus[job] = tuple(p.gpus)
        return Placement(tuple(p.gpus), tuple(p.switches), p.diff, p.note)

    def release(self, job: str) -> None:
        """The job ended: its GPUs are free, its circuits stay."""
        self.occ.release(job)
        del self.gpus[job]

    def defragment(self, running: dict[str, tuple[str, ...]]) -> list[Step]:
        """The controller's joint regrouping of running jobs, committed, as one bulk reconfiguration."""
        d = core_defrag.plan_defrag(self.occ, running)
        if not d.moves:
            return []
        self.occ.apply(d.remove, d.add)
        moves = {}
        for m in d.moves:
            gpus = self.gpus[m.job]
            order = {w: i for i, w in enumerate(m.after)}
            ranked = tuple(sorted(gpus, key=lambda g: order.get(d.where.get(g), len(order))))  # switch by switch
            self.gpus[m.job] = ranked
            moves[m.job] = Placement(ranked, m.after, CircuitDiff(m.remove, m.add))
        return [Step(d.diff, moves)]

    def switch_of(self, gpus) -> dict[str, str]:
        """The switch each of `gpus` hangs under now."""
        out = {}
        for g in gpus:
            w = self.occ.switch_of(g)
            if w is not None:
                out[g] = w
        return out

    def switches(self, gpus) -> set[str]:
        return set(self.switch_of(gpus).values())


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


def _own(circuits: CircuitMap) -> CircuitMap:
    """The same map, remembering its GPUs' locations (its state is shared, not rebuilt)."""
    if isinstance(circuits, _Map):
        return circuits
    wrapped = object.__new__(_Map)
    wrapped.__dict__.update(circuits.__dict__)
    wrapped.__dict__.pop("_where", None)
    return wrapped


class LegacyPlacer:
    """Placement state of one simulated controller on today's API: circuits, and the GPUs and ports each job holds."""

    def __init__(self, rack: Rack):
        self.rack = rack
        self.circuits: CircuitMap = _own(CircuitMap.initial(rack))
        self.gpus: dict[str, tuple[str, ...]] = {}  # job -> its GPUs
        self.busy: set[str] = set()
        self._ports: dict[str, set[PortRef]] = {}  # job -> ports it protects
        self._owner: dict[PortRef, str] = {}

    def free(self) -> int:
        return len(self.rack.gpus) - len(self.busy)

    def place(self, job: str, gpus: int, names: tuple[str, ...], policy: str, workload: str = "vgg16",
              gpu_model: str | None = None) -> Placement | None:
        """Place a new job and commit it, or None when it must wait (too few free GPUs, or no room).
        This older core picks GPUs without regard to their model: `gpu_model` is not honoured."""
        if names:
            if self.busy.intersection(names):
                return None
            chosen = list(names)
        else:
            if gpus > self.free():
                return None
            try:
                chosen = core.pick_gpus(self.rack, self.circuits, self.busy, gpus, policy)
            except core.PlacementError:
                return None
        try:
            p = core.plan(self.rack, self.circuits, chosen, policy, self._owner.keys())
        except core.PlacementError:
            return None
        return self._commit(job, p)

    def release(self, job: str) -> None:
        """The job ended: its GPUs are free, its circuits stay."""
        self.busy.difference_update(self.gpus.pop(job))
        self._protect(job, ())

    def defragment(self, running: dict[str, tuple[str, ...]]) -> list[Step]:
        """Regroup running jobs under fewer switches; commit and return the reconfigurations, in order."""
        steps = []
        for job in sorted(running, key=lambda j: (-len(running[j]), j)):
            if len(self.switches(running[job])) < 2:
                continue
            others = [port for port, owner in self._owner.items() if owner != job]
            try:
                p = core.plan_regroup(self.rack, self.circuits, list(running[job]), others)
            except core.PlacementError:
                continue
            if len(p.switches) >= len(self.switches(running[job])) or p.target == self.circuits:
                continue  # no fewer switches: the job is not touched
            placed = self._commit(job, p)
            steps.append(Step(placed.diff, {job: placed}))
        return steps

    def switch_of(self, gpus) -> dict[str, str]:
        """The switch each of `gpus` hangs under now."""
        out = {}
        for g in gpus:
            other = self.circuits.partner(self.rack.gpu_port(g))
            ep = self.rack.endpoints.get(other) if other else None
            if ep is not None and ep.kind == "switch":
                out[g] = ep.name
        return out

    def switches(self, gpus) -> set[str]:
        return set(self.switch_of(gpus).values())

    def _commit(self, job: str, p: core.Plan) -> Placement:
        diff = self.circuits.diff(p.target)
        self.circuits = _own(p.target)
        if job in self.gpus:
            self.busy.difference_update(self.gpus[job])
        self.gpus[job] = tuple(p.gpus)
        self.busy.update(p.gpus)
        self._protect(job, p.gpus)
        return Placement(tuple(p.gpus), tuple(p.switches), diff, p.note)

    def _protect(self, job: str, gpus) -> None:
        """What a job protects from other jobs' plans: its GPUs' OCS ports and the other ends of their circuits."""
        for port in self._ports.pop(job, ()):
            del self._owner[port]
        if gpus:
            ports = set()
            for g in gpus:
                port = self.rack.gpu_port(g)
                ports.add(port)
                other = self.circuits.partner(port)
                if other is not None:
                    ports.add(other)
            self._ports[job] = ports
            for port in ports:
                self._owner[port] = job


Placer = OccupancyPlacer if Occupancy is not None else LegacyPlacer

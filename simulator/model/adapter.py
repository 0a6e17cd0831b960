"""The one place the simulator calls controller.core.placement: the controller's own decisions.

`Placer` keeps what the controller keeps (the circuits, which job holds which GPUs) and asks
core for every decision, through its occupancy API (`controller.core.occupancy.Occupancy`,
`placement.plan` with a `Request`, `defrag.plan_defrag`): model-aware GPU choice, fewest switches
then fewest circuit changes, and one joint defragmentation applied as one bulk change.
A job that cannot be placed now waits (simulator/model/engine.py keeps the queue, first come first
served, as the controller's queue does).
"""
from __future__ import annotations

from dataclasses import dataclass

from controller.core import defrag as core_defrag
from controller.core import placement as core
from controller.core.circuits import CircuitDiff, CircuitMap
from controller.core.occupancy import Occupancy
from controller.core.rack import Rack


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
            p = core.plan(self.occ, core.Request(names or gpus, policy, gpu_model, workload), job,  # and committed
                          noted=False)  # the controller's words on it: not read here
        except core.NoRoomNow:
            return None
        except core.PlacementError as e:
            raise Unplaceable(f"job {job}: {e}") from None
        self.gpus[job] = tuple(p.gpus)
        return Placement(tuple(p.gpus), tuple(p.switches), p.diff, p.note)

    def hold(self, job: str, gpus: list[str]) -> None:
        """Mark idle GPUs held by `job` (a failed server's, until its repair)."""
        self.occ.hold(job, gpus)
        self.gpus[job] = tuple(gpus)

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


Placer = OccupancyPlacer

"""The one rule for spare GPUs: which free GPUs take the place of a job's lost ones. Pure: the controller's fail-over
(controller/jobs/failover.py) and the simulator hand it what they know of the rack now.

For each lost GPU, in the job's rank order: of the job's model if it asked for one (only those are candidates), of
the lost GPU's model first, under one of the job's switches first, then the fastest for the job's workload, then by
name. The candidates are the caller's: free GPUs, none of a server whose engine is down, none just lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from controller.core.placement import NoRoomNow, seconds_per_iteration
from controller.core.rack import Rack


def choose(
    rack: Rack,
    lost: Sequence[str],
    candidates: Iterable[str],
    workload: str,
    switches: Iterable[str],
    where: Mapping[str, str | None],
    model: str | None = None,
) -> dict[str, str]:
    """Lost GPU -> its spare. `where`: GPU -> the switch it hangs under now (absent or None: none); `model`: the model
    the job asked for. Raises NoRoomNow (saying how many are needed and free) when there are too few candidates."""
    free = [g for g in candidates if model is None or rack.gpus[g].model == model]
    if len(free) < len(lost):
        raise NoRoomNow(f"{len(lost)} spare GPU(s){f' of model {model}' if model else ''} needed, {len(free)} free")
    switches = set(switches)
    spares: dict[str, str] = {}
    for g in lost:
        want = rack.gpus[g].model
        spares[g] = min(
            (c for c in free if c not in spares.values()),
            key=lambda c: (
                rack.gpus[c].model != want,
                where.get(c) not in switches,
                seconds_per_iteration(workload, rack.gpus[c].model),
                c,
            ),
        )
    return spares

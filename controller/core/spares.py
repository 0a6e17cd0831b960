"""The one rule for spare GPUs: which free GPUs take the place of a job's lost ones. Pure: the controller's fail-over
(controller/jobs/recovery.py) and the simulator hand it what they know of the rack now.

For each lost GPU, in the job's rank order: of the job's model if it asked for one (only those are candidates), of
the lost GPU's model first, under one of the job's switches first, then the fastest for the job's workload, then by
name. The candidates are the caller's: free GPUs, none of a server whose engine is down, none just lost.

A killed worker is not a dead GPU (`restartable`): a GPU lost only because its worker died by a signal (kill -9, the
OOM killer), on a server whose engine answers and whose NIC's link is up, and that has not died so in this job before,
may take its own rank again. It is its own last candidate of its model: a free spare of its model is better (the GPU is
suspect), but it goes before a spare of another model and before waiting for one. A second such death sets it aside.
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
    own: Iterable[str] = (),
) -> dict[str, str]:
    """Lost GPU -> its spare. `where`: GPU -> the switch it hangs under now (absent or None: none); `model`: the model
    the job asked for; `own`: the lost GPUs that may be their own spare (`restartable`; mapped to themselves when no
    free spare of their model is left). Raises NoRoomNow (saying how many are needed and free) when there are too few
    candidates."""
    own = [g for g in lost if g in set(own)]
    free = [g for g in candidates if model is None or rack.gpus[g].model == model]
    needed = len(lost) - len(own)
    if len(free) < needed:
        raise NoRoomNow(f"{needed} spare GPU(s){f' of model {model}' if model else ''} needed, {len(free)} free")
    switches = set(switches)
    spares: dict[str, str] = {}
    # the GPUs that must have a spare first (in rank order), then those that may fall back on themselves
    for g in [g for g in lost if g not in own] + own:
        want = rack.gpus[g].model
        spares[g] = min(
            [c for c in free if c not in spares.values()] + ([g] if g in own else []),
            key=lambda c: (
                rack.gpus[c].model != want,
                c == g,  # itself: after every spare of its model, before any other
                where.get(c) not in switches,
                seconds_per_iteration(workload, rack.gpus[c].model),
                c,
            ),
        )
    return {g: spares[g] for g in lost}


def restartable(
    lost: Iterable[str],
    killed: Iterable[str],
    servers_down: Iterable[str],
    links_down: Iterable[str],
    server_of: Mapping[str, str],
    restarted_before: Iterable[str],
) -> list[str]:
    """The lost GPUs that may take their own rank again: those whose worker died by a signal (`killed`), on a server
    whose engine answers (not in `servers_down`), whose NIC's link is up (not in `links_down`: GPUs), and that were not
    restarted so before in this job (`restarted_before`: each GPU once per earlier restart of its own)."""
    killed, down, links, before = set(killed), set(servers_down), set(links_down), set(restarted_before)
    return [g for g in lost if g in killed and server_of[g] not in down and g not in links and g not in before]

"""In-network aggregation for the jobs that ask for it (`collective: aggregate`): where their gradients are summed.

Such a job is placed with all its GPUs under one switch whose aggregator (the rack file's switches[].aggregator,
controller/core/aggregators.py) has room: one of its `jobs` free and the bytes of the job's slot pool free within its
`capacity_bytes`. Its record (Job.aggregation) then names the switch, the aggregator's address, the job's key there
and the pool, and its workers are started with `--collective aggregate --aggregator IP:PORT` (workers.py). Where no
aggregator has room, or no switch with one can take its GPUs now, it is placed as any job and runs as a ring, and its
record says why.

The reservation is the record itself while the job is active: nothing else holds it. A job that ends (done, failed,
stopped) no longer counts; a recovering one still does until its new attempt is planned. Its new attempt's room is
chosen on the loop, where admission reserves, when its spares are (`choose`): under a switch whose aggregator has room
(the job's own room counted free, so it may stay), and from then the recovery's record (`room`) holds it in place of
the old attempt's, in that one step (never two attempts holding room); the circuit change places the new attempt under
that switch (`place`), and the job's record then names that aggregator, or a ring with the reason. A swap that fails,
or a restart that finds one under way, gives the chosen room up (`release`) until the next try chooses again; the old
attempt's pool is freed at its aggregator (controller/jobs/recovery.py). A restarted controller counts again from the
jobs it loads, a recovery under way included. A job confined to its aggregator's switch that can
no longer be placed there when it starts (the circuits changed since its admission) is placed as any job and runs
as a ring (`placed`); so does one whose workers say the aggregator did not take it (`reported`).
"""

from __future__ import annotations

import dataclasses
import zlib

from containers import aggproto
from controller.core import aggregators
from controller.core import placement as policy
from controller.core.jobs import Job
from controller.core.occupancy import Occupancy
from controller.core.rack import Rack
from controller.jobs.book import JobBook
from controller.jobs.steps import request_of

AGGREGATE, RING = "aggregate", "ring"


def asks(job: Job) -> bool:
    return job.request.get("collective") == AGGREGATE


def aggregating(job: Job) -> dict | None:
    """The job's aggregator (its record's aggregation) if it aggregates, else None."""
    a = job.aggregation
    return a if a is not None and a.get("collective") == AGGREGATE else None


def pool_shape(rack: Rack) -> tuple[int, int]:
    """(slots, chunk) of a job's pool on this rack: a chunk that fills one frame of its NICs' MTU (the worker's own
    default, passed to it so that what it asks is what was reserved)."""
    return aggproto.shape_for_mtu(rack.spec.emulation.mtu)


def holds(job: Job) -> dict | None:
    """The room the job holds: its new attempt's, chosen and not yet placed or given up (its recovery's `room`: None
    once given up), else its record's; None where it holds none (a ring, or no aggregation asked)."""
    rec = job.recovery if job.state == "recovering" else None
    a = rec["room"] if rec is not None and "room" in rec else job.aggregation
    return a if a is not None and a.get("collective") == AGGREGATE else None


def held(book: JobBook, exclude: str | None = None) -> dict[str, tuple[int, int]]:
    """Switch -> (jobs, bytes) its aggregator holds for the active jobs (but `exclude`)."""
    use: dict[str, tuple[int, int]] = {}
    for job in book.jobs.live.values():
        a = holds(job)
        if a is not None and job.active and job.id != exclude:
            n, b = use.get(a["switch"], (0, 0))
            use[a["switch"]] = (n + 1, b + a["bytes"])
    return use


def key_of(job: Job) -> int:
    """The job's key at the aggregator: one per job (its attempts share it: a new attempt's ranks join again from
    their new addresses, which starts the pool afresh), another for a job of the same id in another state."""
    return zlib.crc32(f"{job.id}@{job.created_at!r}".encode())


def plan(book: JobBook, occ: Occupancy, job: Job,
         req: policy.Request | None = None) -> tuple[policy.Plan, dict | None]:
    """The job's plan and its aggregation (None if it did not ask for it): under a switch whose aggregator has room
    where one can take it, else placed as any job, a ring with the reason. `req`: what to place (the job's request by
    default; a fail-over's new attempt, its GPUs named). The job's own room counts as free: a new attempt gives the
    old one's up. Raises as policy.plan does."""
    req = req or request_of(job)
    if not asks(job):
        return policy.plan(occ, req), None
    slots, chunk = pool_shape(book.rack)
    need = slots * chunk * aggproto.ITEM
    use = held(book, exclude=job.id)
    room: list[aggregators.Aggregator] = []
    full: list[str] = []
    for a in aggregators.aggregators(book.rack):
        n, b = use.get(a.switch, (0, 0))
        if n >= a.jobs:
            full.append(f"{a.switch}'s holds {n} job(s), its most")
        elif b + need > a.capacity_bytes:
            full.append(f"{a.switch}'s has {a.capacity_bytes - b} of {a.capacity_bytes} bytes free, {need} needed")
        else:
            room.append(a)
    if room:
        try:
            p = policy.plan(occ, dataclasses.replace(req, switches=tuple(a.switch for a in room)))
        except policy.NoRoomNow as e:
            why = f"no switch whose aggregator has room can take its GPUs now: {e}"
        else:
            a = next(a for a in room if a.switch == p.switches[0])
            key = (job.aggregation or {}).get("key") or key_of(job)  # a new attempt's is the job's
            return p, {"collective": AGGREGATE, "switch": a.switch, "address": a.address, "key": key,
                       "bytes": need, "slots": slots, "chunk": chunk}
    elif full:
        why = "no aggregator has room: " + "; ".join(full)
    else:
        why = f"rack {book.rack.name} has no in-network aggregator"
    return policy.plan(occ, req), {"collective": RING, "reason": why}


def choose(book: JobBook, occ: Occupancy, job: Job, req: policy.Request) -> None:
    """A fail-over's new attempt (`req`, its GPUs named): its room chosen as `plan` does, on the occupancy now, and
    reserved in the same step (the recovery's `room`, which `held` counts in place of the old attempt's). Where its
    GPUs cannot be placed now, a ring with the reason."""
    if not asks(job) or job.recovery is None:
        return
    try:
        job.recovery["room"] = plan(book, occ, job, req)[1]
    except policy.PlacementError as e:  # the circuit change will meet it too, and the step fail
        job.recovery["room"] = {"collective": RING, "reason": f"no switch could take its GPUs when its new attempt "
                                f"was planned: {e}"}


def release(job: Job) -> None:
    """The chosen room given up (a failed swap, a restart that found one under way): the job holds none until its
    next try chooses again."""
    if job.recovery is not None and "room" in job.recovery:
        job.recovery["room"] = None


def place(occ: Occupancy, req: policy.Request, room: dict | None) -> tuple[policy.Plan, dict | None]:
    """The circuit change's plan of a fail-over's new attempt and its aggregation: under the switch of the room chosen
    for it (`choose`); a ring with the reason where that switch can no longer take its GPUs (the circuits changed
    since), placed as any job. `room` None: no aggregation asked. Raises as policy.plan."""
    if room is None or room.get("collective") != AGGREGATE:
        return policy.plan(occ, req), room
    try:
        return policy.plan(occ, dataclasses.replace(req, switches=(room["switch"],))), room
    except policy.NoRoomNow as e:
        return policy.plan(occ, req), {"collective": RING, "reason": f"{room['switch']}, whose aggregator was "
                                       f"chosen for its new attempt, could no longer take its GPUs: {e}"}


def failover_note(old: dict | None, new: dict | None) -> str:
    """What a fail-over's event and the job's note say of the new attempt's collective ('' where it did not ask)."""
    if new is None:
        return ""
    if new.get("collective") == AGGREGATE:
        was = old if old is not None and old.get("collective") == AGGREGATE else None
        moved = "" if was is not None and was["switch"] == new["switch"] else \
            f" (moved from {was['switch']}'s)" if was is not None else " (a ring before)"
        return f"the new attempt aggregates at {new['switch']}'s aggregator {new['address']}{moved}"
    return f"the new attempt runs as a ring: {new['reason']}"


def placed(job: Job, p: policy.Plan) -> None:
    """The placement that stands: a job confined to its aggregator's switch and placed elsewhere runs as a ring."""
    a = aggregating(job)
    if a is not None and tuple(p.switches) != (a["switch"],):
        job.aggregation = {"collective": RING, "reason": f"placed under {', '.join(p.switches)}: {a['switch']}, "
                           "whose aggregator was reserved for it, could no longer take all its GPUs when it started"}


def reported(job: Job, line: dict) -> bool:
    """A worker's start line in the job's attempt says it runs as a ring though the job was to aggregate (the
    aggregator refused it, e.g. a stopped job's pool still held there, or did not answer): the record says so and the
    room is given back. Whether the record changed."""
    a = aggregating(job)
    if a is None or line.get("event") != "start" or line.get("collective") != RING \
            or line.get("attempt", 0) != job.attempt:
        return False
    job.aggregation = {"collective": RING, "reason": f"{a['switch']}'s aggregator {a['address']} did not take it "
                       f"({line.get('aggregation_refused') or 'no reason given'}): its workers run as a ring"}
    return True


def worker_args(job: Job) -> list[str]:
    """The worker's flags for the job's collective (none for a ring)."""
    a = aggregating(job)
    if a is None:
        return []
    return ["--collective", AGGREGATE, "--aggregator", a["address"], "--aggregation-job", str(a["key"]),
            "--aggregation-slots", str(a["slots"]), "--aggregation-chunk", str(a["chunk"])]

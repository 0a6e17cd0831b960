"""The job book: the one table the job service's loop reads and writes. The jobs (persisted with the rack state), their
ids, the queue, the GPUs held (by active jobs, by stopped ones whose containers are still going, by spares a recovery
has chosen), the world as last observed (servers down, links down, each rank's last signs of life and progress), the
actions in flight, the warm spares, and the occupancy of the rack.

Only the loop (loop.py) changes it; threads read it (the REST API's reads, a plan computed under the reconfiguration
lock), which the runtime's cooperative threads make safe between two yields."""

from __future__ import annotations

import collections
import itertools
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.core.circuits import CircuitMap
from controller.core.jobs import QUEUED, TERMINAL, Job, JobTable
from controller.core.occupancy import Occupancy
from controller.core.rack import PortRef, Rack
from controller.jobs.errors import UnknownJob
from controller.jobs.inbox import End
from controller.jobs.runtime import Lock
from controller.jobs.steps import LOG
from controller.state import RackState

RECENT = 8  # iterations of a rank its recent median is taken over


@dataclass
class Rank:
    """What is observed of one rank (job, GPU) in the attempt its follower serves."""

    attempt: int
    since: float  # when its follower started (its container started, or was told its new ring)
    alive_at: float | None = None  # its last line of any kind (a heartbeat, an iteration, ...)
    iteration_at: float | None = None  # its last iteration line
    iteration: int = -1
    iter_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT))
    compute_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT))
    ended: bool = False

    def median_iter_s(self) -> float | None:
        return statistics.median(self.iter_s) if self.iter_s else None

    def median_compute_s(self) -> float | None:
        return statistics.median(self.compute_s) if self.compute_s else None


class JobBook:
    def __init__(self, state: RackState) -> None:
        self.state = state  # the rack state (controller/state.py): the jobs are saved with the circuits
        self.jobs = JobTable(Job.from_state(j) for j in state.saved.get("jobs", []))
        start = max((int(j.split("-")[-1]) for j in self.jobs if j.split("-")[-1].isdigit()), default=0) + 1
        self._ids = itertools.count(start)
        self.queue: collections.deque[str] = collections.deque(
            j.id for j in sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id)) if j.state == QUEUED
        )
        self.stopping: set[str] = set()  # jobs ended whose containers are still being removed: GPUs still held
        self.awaiting: set[str] = set()  # recovering jobs waiting for spares at the head of the queue
        self.ending: dict[str, list] = {}  # jobs whose end is under way -> the replies to answer once it is done
        self.deferred: dict[str, End] = {}  # job -> its End, taken once the action it has in flight is done
        self.waiting: dict[str, list] = {}  # job -> the replies its deferred End will answer
        self.admitted: dict[str, object] = {}  # pending job -> its admission's plan (to restate against the placement)
        self.down: dict[str, str] = {}  # servers observed down (engine, or hung): server -> why
        self.links_down: set[str] = set()  # OCS ports whose link is down
        self.ranks: dict[tuple[str, str], Rank] = {}  # (job, GPU) -> what is observed of it
        self.inflight: dict[str, tuple[str, int]] = {}  # job -> (the step its action will hand its result, token)
        self.warm: dict[str, str] = {}  # GPU -> the job whose warm spare waits on it
        self.resuming: set[str] = set()  # recovering jobs found at a restart, their servers not yet observed again
        self.unwarmed: set[str] = set()  # jobs told once that no GPU of their model is free to keep warm
        self.serves: dict[str, tuple] = {}  # a warm spare's GPU -> the (GPU model, switch) of the GPUs it stands by
        self.tokens = itertools.count(1)
        self.followers: dict[tuple[str, str], int] = {}  # (job, GPU) -> the follower whose word counts
        self.replay: dict[tuple[str, str], set[str]] = {}  # (job, GPU) followed again: the lines already recorded
        self.fids = itertools.count(1)
        self.owners: dict[str, Lock] = {}  # GPU -> the lock of whoever removes or starts a leftover there
        self.occupancy = Occupancy(state.rack, state.circuits, self.busy_gpus())

    @property
    def rack(self) -> Rack:
        return self.state.rack

    def clock(self) -> float:
        return self.state.clock()

    def new_id(self) -> str:
        return f"job-{next(self._ids)}"

    def get(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise UnknownJob(job_id)
        return self.jobs[job_id]

    def of(self, kind: str, *states: str) -> list[Job]:
        """The jobs of a kind ("containers", "external": Job.kind) in `states`, oldest first."""
        return [j for j in self.jobs.values() if j.kind == kind and j.state in states]

    def busy_gpus(self) -> dict[str, str]:
        """GPU -> the job holding it (its GPUs, and the spares its recovery has chosen but not yet placed)."""
        held = [j for j in self.jobs.values() if j.active or j.id in self.stopping]
        busy = {g: j.id for j in held for g in j.gpus or requested(j)}
        for j in held:
            if j.state == "recovering" and j.recovery:
                busy.update({s: j.id for s in (j.recovery.get("spares") or {}).values()})
        return busy

    def unlinked(self) -> list[str]:
        """GPUs whose NIC's link the OCS reported down."""
        return [g for g in self.rack.gpus if str(self.rack.gpu_port(g)) in self.links_down]

    def down_servers(self) -> dict[str, str]:
        return dict(self.down)

    def occ(self, circuits: CircuitMap | None = None, exclude: str | None = None,
            down: Iterable[str] = ()) -> Occupancy:
        """The occupancy brought up to date with `circuits` (default: now) and the held GPUs (but `exclude`'s); the
        GPUs of the servers in `down`, and those whose NIC's link is down, count as held too (a new job avoids them)."""
        holders = {g: j for g, j in self.busy_gpus().items() if j != exclude}
        down = set(down)
        server_of = self.rack.server_of
        holders.update({g: f"the engine of {s} (down)" for g, s in server_of.items() if s in down and g not in holders})
        holders.update({g: "its NIC's link (down)" for g in self.unlinked() if g not in holders})
        self.occupancy.sync(self.state.circuits if circuits is None else circuits, holders)
        return self.occupancy

    def protected_ports(self, exclude: str | None = None, circuits: CircuitMap | None = None) -> dict[PortRef, str]:
        """OCS ports of active jobs' GPUs and their circuits' other ends (in `circuits`, default the current map)."""
        circuits = circuits if circuits is not None else self.state.circuits
        result = {}
        for job in self.jobs.values():
            if job.active and job.id != exclude:
                for g in job.gpus:
                    p = self.rack.gpu_port(g)
                    result[p] = job.id
                    other = circuits.partner(p)
                    if other is not None:
                        result[other] = job.id
        return result

    def circuits_of(self, job: Job) -> list[list[str]]:
        """The circuits that carry `job`'s GPUs now (what a restarted controller checks the devices against)."""
        out = []
        for g in job.gpus:
            p = self.rack.gpu_port(g)
            other = self.state.circuits.partner(p)
            if other is not None:
                out.append([str(p), str(other)])
        return out

    def number_queue(self) -> None:
        for i, job_id in enumerate(self.queue):
            self.jobs[job_id].position = i + 1

    def save(self, job: Job | None = None) -> None:
        """Persist `job` (a job that just ended must be named) and every active job, with the circuits:
        one transaction whose size does not grow with the history of finished jobs."""
        jobs = self.jobs.to_save(job)
        self.state.save(jobs=[j.to_state() for j in jobs])
        self.jobs.saved(jobs)

    def page(
        self, limit: int, before: str | None = None, states: set[str] | None = None
    ) -> tuple[list[Job], str | None]:
        """The newest `limit` jobs created before job `before` (in `states`), oldest first, and the id
        to pass as `before` for the page before it (None: no older job)."""
        jobs = list(self.jobs.values())
        if before is not None:
            jobs = jobs[: list(self.jobs).index(self.get(before).id)]
        if states:
            jobs = [j for j in jobs if j.state in states]
        page = jobs[-limit:]
        return page, (page[0].id if len(jobs) > len(page) else None)

    def prune(self, older_than_s: float | None, keep: int | None) -> list[str]:
        """Forget finished jobs that ended more than `older_than_s` ago, keeping the newest `keep` of them."""
        now = self.clock()
        finished = [j for j in self.jobs.values() if j.state in TERMINAL]
        candidates = finished[: max(0, len(finished) - (keep or 0))]
        gone = [j.id for j in candidates if older_than_s is None or (j.ended_at or j.created_at) <= now - older_than_s]
        self.forget(gone)
        LOG.info("pruned %d finished jobs", len(gone))
        return gone

    def forget(self, job_ids: list[str]) -> None:
        self.state.store.delete_jobs(job_ids)
        for job_id in job_ids:
            del self.jobs[job_id]
            for key in [k for k in self.ranks if k[0] == job_id]:
                del self.ranks[key]

    # --- ranks: what the followers' lines say ---------------------------------------------------
    def follow(self, job: Job, gpus: Iterable[str]) -> None:
        """The ranks of `gpus` start (again) in the job's attempt: what was seen of them before no longer counts."""
        for g in gpus:
            self.ranks[(job.id, g)] = Rank(job.attempt, self.clock())

    def refollow(self, job: Job, gpus: Iterable[str]) -> None:
        """The workers of `gpus` are followed again (after a restart): their output comes from its start, and what
        is recorded of it already is not recorded twice."""
        for g in gpus:
            self.replay[(job.id, g)] = {line_key(r) for r in job.reports.get(g, [])}

    def rank(self, job: Job, gpu: str) -> Rank | None:
        r = self.ranks.get((job.id, gpu))
        return r if r is not None and r.attempt == job.attempt else None


def line_key(line: dict) -> str:
    """A worker's line as it is recorded (its own attempt in it), to tell one already recorded."""
    return json.dumps(line, sort_keys=True)


def requested(job: Job) -> list[str]:
    """The GPUs a job named in its request ([] if it asked for a number)."""
    gpus = job.request.get("gpus")
    return gpus if isinstance(gpus, list) else []

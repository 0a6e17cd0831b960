"""The job book: the one table every part of the job service reads and writes. The jobs (persisted with the rack
state), their ids, the queue, the GPUs held (by active jobs and by stopped ones whose containers are still going),
the recovering jobs waiting for spares, the threads following each job's workers, and the occupancy of the rack."""

from __future__ import annotations

import collections
import itertools

from controller.core.circuits import CircuitMap
from controller.core.jobs import QUEUED, TERMINAL, Job, JobTable
from controller.core.occupancy import Occupancy
from controller.core.rack import PortRef
from controller.jobs.errors import UnknownJob
from controller.jobs.steps import LOG


class JobBook:
    def __init__(self, state):
        self.state = state  # the rack state (controller/state.py): the jobs are saved with the circuits
        self.jobs = JobTable(Job.from_state(j) for j in state.saved.get("jobs", []))
        start = max((int(j.split("-")[-1]) for j in self.jobs if j.split("-")[-1].isdigit()), default=0) + 1
        self._ids = itertools.count(start)
        self.queue: collections.deque[str] = collections.deque(
            j.id for j in sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id)) if j.state == QUEUED
        )
        self.stopping: set[str] = set()  # jobs stopped whose containers are still being removed: GPUs still held
        self.awaiting: set[str] = set()  # recovering jobs waiting for spares at the head of the queue
        self.threads: dict[str, list] = {}  # job -> the threads following its workers
        self.occupancy = Occupancy(state.rack, state.circuits, self.busy_gpus())

    def new_id(self) -> str:
        return f"job-{next(self._ids)}"

    def get(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise UnknownJob(job_id)
        return self.jobs[job_id]

    def busy_gpus(self) -> dict[str, str]:
        """GPU -> the job holding it."""
        held = [j for j in self.jobs.values() if j.active or j.id in self.stopping]
        return {g: j.id for j in held for g in j.gpus or requested(j)}

    def occ(self, circuits: CircuitMap | None = None, exclude: str | None = None, down=()) -> Occupancy:
        """The occupancy brought up to date with `circuits` (default: now) and the held GPUs (but `exclude`'s); the
        GPUs of the servers in `down` (server -> why) count as held too (a new job avoids them)."""
        holders = {g: j for g, j in self.busy_gpus().items() if j != exclude}
        down = dict(down)
        server_of = self.state.rack.server_of
        holders.update({g: f"the engine of {s} (down)" for g, s in server_of.items() if s in down and g not in holders})
        self.occupancy.sync(self.state.circuits if circuits is None else circuits, holders)
        return self.occupancy

    def protected_ports(self, exclude: str | None = None, circuits: CircuitMap | None = None) -> dict[PortRef, str]:
        """OCS ports of active jobs' GPUs and their circuits' other ends (in `circuits`, default the current map)."""
        circuits = circuits if circuits is not None else self.state.circuits
        result = {}
        for job in self.jobs.values():
            if job.active and job.id != exclude:
                for g in job.gpus:
                    p = self.state.rack.gpu_port(g)
                    result[p] = job.id
                    other = circuits.partner(p)
                    if other is not None:
                        result[other] = job.id
        return result

    def circuits_of(self, job: Job) -> list[list[str]]:
        """The circuits that carry `job`'s GPUs now (what a restarted controller checks the devices against)."""
        out = []
        for g in job.gpus:
            p = self.state.rack.gpu_port(g)
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
        now = self.state.clock()
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


def requested(job: Job) -> list[str]:
    """The GPUs a job named in its request ([] if it asked for a number)."""
    gpus = job.request.get("gpus")
    return gpus if isinstance(gpus, list) else []

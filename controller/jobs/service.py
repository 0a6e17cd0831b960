"""The job service: the jobs users submit, from admission to their end, free of Ryu and eventlet.

Admit or queue (first in, first out) -> plan (core.placement) -> OCS diff and flows (the OCS app, confirmed) -> one
container per GPU (the container driver) -> follow the workers -> clean up, and start the queued jobs that fit now. A
failure at any step undoes what was done: the job's circuit changes are reversed, its containers removed, its GPUs
freed, and the job fails with the reason. Defragmentation (core.defrag) moves running jobs in one change. Jobs and
circuits are persisted, so a restarted controller takes its running jobs and its queue back. Each part of it is a
module of its own (queue, lifecycle, regroup, recovery); this one holds the state and what others ask of it.
"""

from __future__ import annotations

import collections
import itertools

from controller.core.circuits import CircuitMap
from controller.core.jobs import QUEUED, TERMINAL, Job, JobTable
from controller.core.occupancy import Occupancy
from controller.core.rack import PortRef
from controller.jobs.errors import UnknownJob
from controller.jobs.failover import FailoverMixin
from controller.jobs.lifecycle import LifecycleMixin
from controller.jobs.queue import QueueMixin
from controller.jobs.recovery import RecoveryMixin
from controller.jobs.regroup import RegroupMixin
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG


class JobService(QueueMixin, LifecycleMixin, RegroupMixin, RecoveryMixin, FailoverMixin):
    def __init__(self, ctx, driver, runtime: Runtime, engine_poll: float, hold_configuring: bool = False):
        self.ctx = ctx  # the controller's context: rack, circuits and their version, store, clock, the OCS app
        self.rt = runtime
        self.ctx.placement = self
        self.driver = driver
        self.hold_configuring = hold_configuring  # a fault hook for tests: jobs stop at configuring (lifecycle._hold)
        self.jobs = JobTable(Job.from_state(j) for j in self.ctx.saved.get("jobs", []))
        start = max((int(j.split("-")[-1]) for j in self.jobs if j.split("-")[-1].isdigit()), default=0) + 1
        self._ids = itertools.count(start)
        self.admission = self.rt.lock()  # plan and reconfigure one job at a time
        self._admit = self.rt.lock()  # admission (submit and the queue) one job at a time
        self.queue: collections.deque[str] = collections.deque(
            j.id for j in sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id)) if j.state == QUEUED
        )
        # jobs stopped whose containers are still being removed: their GPUs (and NICs) are not free yet
        self._stopping: set[str] = set()
        self.occupancy = Occupancy(self.ctx.rack, self.ctx.circuits, self.busy_gpus())
        self._plans: collections.OrderedDict[int, dict] = collections.OrderedDict()  # version -> dry-run plan
        self._threads: dict[str, list] = {}
        # failover.py: the signs of a loss gathered per job, jobs gathering them, when the first came, OCS ports whose
        # link is down, and recovering jobs waiting for spares at the head of the queue
        self._losing: dict[str, dict] = {}
        self._collecting: set[str] = set()
        self._detected: dict[str, float] = {}
        self._links_down: set[str] = set()
        self._awaiting: set[str] = set()
        self.rt.spawn(self._recover)
        self.engine_poll = engine_poll
        self.rt.spawn(self._watch_engines)
        self.rt.spawn(self._watch_servers)
        if self.queue:
            self.rt.spawn(self._drain_when_ready)

    # --- what other apps and the REST API ask ---------------------------------------
    def busy_gpus(self) -> dict[str, str]:
        held = [j for j in self.jobs.values() if j.active or j.id in self._stopping]
        return {g: j.id for j in held for g in j.gpus or self._requested(j)}

    gpu_jobs = busy_gpus

    @staticmethod
    def _requested(job: Job) -> list[str]:
        gpus = job.request.get("gpus")
        return gpus if isinstance(gpus, list) else []

    def protected_ports(self, exclude: str | None = None, circuits: CircuitMap | None = None) -> dict[PortRef, str]:
        """OCS ports of active jobs' GPUs and their circuits' other ends (in `circuits`, default the current map)."""
        circuits = circuits if circuits is not None else self.ctx.circuits
        result = {}
        for job in self.jobs.values():
            if job.active and job.id != exclude:
                for g in job.gpus:
                    p = self.ctx.rack.gpu_port(g)
                    result[p] = job.id
                    other = circuits.partner(p)
                    if other is not None:
                        result[other] = job.id
        return result

    def get(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise UnknownJob(job_id)
        return self.jobs[job_id]

    def save(self, job: Job | None = None) -> None:
        """Persist `job` (a job that just ended must be named) and every active job, with the circuits:
        one transaction whose size does not grow with the history of finished jobs."""
        jobs = self.jobs.to_save(job)
        self.ctx.save(jobs=[j.to_state() for j in jobs])
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
        now = self.ctx.clock()
        finished = [j for j in self.jobs.values() if j.state in TERMINAL]
        candidates = finished[: max(0, len(finished) - (keep or 0))]
        gone = [j.id for j in candidates if older_than_s is None or (j.ended_at or j.created_at) <= now - older_than_s]
        self.ctx.store.delete_jobs(gone)
        for job_id in gone:
            del self.jobs[job_id]
        LOG.info("pruned %d finished jobs", len(gone))
        return gone

"""The job service: the jobs users submit, from admission to their end, free of Ryu and eventlet.

Admit or queue (first in, first out) -> plan (core.placement) -> circuit change (the OCS and the packet switches,
confirmed) -> one container per GPU -> follow the workers -> clean up, and start the queued jobs that fit now. A failure
at any step undoes what was done: the job's circuit changes are reversed, its containers removed, its GPUs freed, and
the job fails with the reason. Defragmentation (core.defrag) moves running jobs in one change. Jobs and circuits are
persisted, so a restarted controller takes its running jobs and its queue back.

Built from what it needs, handed in by the controller's wiring (controller/apps/context.py), or by a test:

    state       the rack state (controller/state.py): rack, circuits and their version, events, store, clock
    changes     the circuit-change port (ports.CircuitChangesPort; controller/devices/changes.py)
    containers  the containers port (ports.ContainersPort; controller/drivers/containers.py)
    runtime     threads, sleeps, locks (runtime.Runtime; Ryu's hub in the controller, virtual time in tests)

Its parts are classes that share one job book (book.JobBook: the table, ids, queue, held GPUs) and get their
collaborators in their constructors, built here in order:

    book -> workers (a job's containers) -> lifecycle (run, follow, end, stop) -> queue (submit, drain)
         -> failover (a lost GPU swapped for a spare) -> recovery (after a restart; engines that come back)
         -> regroup (one job, or all of them at once)

The facade: `submit`, `stop`, `regroup` (one job; `regroup_all` for all), `get`, `list`; `delete`, `prune`, `logs`;
what other parts read (`busy_gpus`, `protected_ports`, `down_servers`, `fragmentation`) and the one sign they hand in
(`link_changed`). `start()` starts its threads (the placement app calls it).

To add a kind of job (say one scheduled from outside, whose GPUs get circuits and flows but no containers, and that
is ended from outside): give it a class of its own over the same book and ports, as `Regroup` is, which places with
`changes.change` and `book.occ` and ends with `book.save`; mark its jobs in their request so that lifecycle, failover
and recovery pass them over; and add its two or three methods here.
"""

from __future__ import annotations

from controller.core import placement as policy
from controller.core.circuits import CircuitMap
from controller.core.jobs import Job, JobRequest
from controller.core.rack import PortRef
from controller.jobs.book import JobBook
from controller.jobs.external import External
from controller.jobs.failover import Failover
from controller.jobs.lifecycle import Lifecycle
from controller.jobs.queue import Queue
from controller.jobs.recovery import Recovery
from controller.jobs.regroup import Regroup
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG_LINES
from controller.jobs.warm import Warm
from controller.jobs.workers import Workers


class JobService:
    def __init__(
        self,
        state,
        changes,
        containers,
        runtime: Runtime,
        engine_poll: float,
        hold_configuring: bool = False,
        hold_recovering: str | None = None,
        keep_survivors: bool = True,
    ):
        self.state, self.rt = state, runtime
        self.book = book = JobBook(state)
        self.workers = workers = Workers(state.rack, containers, runtime)
        self.lifecycle = Lifecycle(
            book,
            state,
            changes,
            containers,
            workers,
            runtime,
            lost=lambda *a, **kw: self.failover.lost(*a, **kw),
            freed=lambda: self.queue.drain(),
            hold_configuring=hold_configuring,
            warm_up=lambda job: self.warm.fill(job),
        )
        self.queue = Queue(book, state, changes, containers, runtime, run=self.lifecycle.run)
        self.failover = Failover(
            book, state, changes, containers, workers, self.lifecycle, runtime, self.queue.drain, hold_recovering,
            keep_survivors, warm_up=lambda job: self.warm.fill(job),
        )
        self.warm = Warm(book, state, containers, workers, runtime, enabled=keep_survivors)  # both need regroup
        self.recovery = Recovery(
            book,
            state,
            containers,
            workers,
            self.lifecycle,
            runtime,
            engine_poll,
            wait_for_devices=self.queue.wait_for_devices,
            drain=self.queue.drain,
            resume=self.failover.resume,
        )
        self.regrouper = Regroup(book, state, changes, self.queue.drain)
        self.external = External(book, state, changes, self.lifecycle, self.queue.drain)

    def start(self) -> None:
        """Its threads: the restart's reconciling, the watches on engines and servers, a queue left from before."""
        self.rt.spawn(self.recovery.recover, self.recovery.found())
        self.rt.spawn(self.recovery.watch_engines)
        self.rt.spawn(self.failover.watch_servers)
        if self.book.queue:
            self.rt.spawn(self.queue.drain_when_ready)

    # --- the facade ---------------------------------------------------------------------------
    def submit(self, req: JobRequest) -> Job:
        """Placed at once (started in the background) or queued; raises policy.InvalidRequest, policy.NoRoomNow (not
        now and not queued), policy.PlacementError (never on this rack), Conflict (an engine named is down)."""
        return self.queue.submit(req)

    def stop(self, job_id: str) -> Job:
        """Stop a queued, running or recovering job (an ended one is returned as it is); Conflict while placed."""
        return self.lifecycle.stop(self.book.get(job_id), self.queue.stop_queued)

    def regroup(self, job_id: str):
        """A running job's GPUs under fewer switches: (the event or None, what happened in words)."""
        return self.regrouper.regroup_with_note(job_id)

    def regroup_all(self, dry_run: bool = False, version: int | None = None) -> dict:
        """Defragment: every running job regrouped in one change (`dry_run`: the plan; `version`: apply that plan)."""
        return self.regrouper.regroup_all(dry_run=dry_run, version=version)

    def begin_external(self, scheduler: str, job_id: str, user: str, gpus: list[str], hold: bool = False,
                       policy_name: str = "regroup") -> Job:
        """A job a scheduler outside placed (Slurm's prolog): its GPUs regrouped under one switch and held, no
        container started (external.py); raises policy.InvalidRequest, Conflict (held, or not regroupable with hold)."""
        return self.external.begin(scheduler, job_id, user, gpus, hold, policy_name)

    def end_external(self, scheduler: str, job_id: str, state: str) -> Job:
        """That job ended outside: its GPUs and circuits are released (UnknownJob if it was never placed)."""
        return self.external.end(scheduler, job_id, state)

    def get(self, job_id: str) -> Job:
        """The job (UnknownJob if there is none of that id)."""
        return self.book.get(job_id)

    def list(self, limit: int, before: str | None = None, states: set[str] | None = None):
        """A page of jobs, oldest first, and the id to ask `before` for the page before it (None: no older job)."""
        return self.book.page(limit, before, states)

    def delete(self, job_id: str) -> Job:
        """Stop the job if it runs, then forget it; its last record."""
        job = self.stop(job_id)
        self.book.forget([job_id])
        return job

    def prune(self, older_than_s: float | None, keep: int | None) -> list[str]:
        """Forget finished jobs that ended more than `older_than_s` ago, keeping the newest `keep`; their ids."""
        return self.book.prune(older_than_s, keep)

    def logs(self, job: Job, tail: int = LOG_LINES) -> tuple[dict[str, list[str]], str]:
        """A running job's live log lines, else those kept when it ended; and which."""
        return self.workers.logs(job, tail)

    # --- what other parts read, and hand in ------------------------------------------------------------
    @property
    def jobs(self):
        return self.book.jobs

    def busy_gpus(self) -> dict[str, str]:
        return self.book.busy_gpus()

    def protected_ports(self, exclude: str | None = None, circuits: CircuitMap | None = None) -> dict[PortRef, str]:
        return self.book.protected_ports(exclude, circuits)

    def down_servers(self) -> dict[str, str]:
        return self.recovery.down_servers()

    def fragmentation(self) -> dict:
        return policy.fragmentation(self.book.occ())

    def link_changed(self, port: PortRef, up: bool) -> None:
        """The OCS reported a port's link up or down (a GPU's NIC: its job loses that GPU)."""
        self.failover.link_changed(port, up)

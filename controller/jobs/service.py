"""The job service: the jobs users submit, from admission to their end, free of Ryu and eventlet.

Admit or queue (first in, first out, or by backfill or shortest job first) -> plan (core.placement) -> circuit change
(the OCS and the packet switches, confirmed) -> one container per GPU -> follow the workers -> clean up, and start the
queued jobs that fit now. A loss (a worker killed, a server down or hung, a link down) is recovered by swapping spares
in and restarting the ranks from the newest checkpoint; a failure at any step of a job's start undoes what was done.
Defragmentation (core.defrag) moves running jobs in one change. Jobs and circuits are persisted, so a restarted
controller takes its jobs back.

One inbox, one loop (inbox.py, loop.py): threads that follow workers, watch engines, tick the clock, run actions and
serve the API only post events; the loop takes them one at a time and hands each to the steps of the parts below,
which decide from the job book (book.py) and the world as observed, and start the I/O they decide on as actions
(actions.py) whose outcomes come back as events. Every part is built from ports (ports.py), the book, the inbox, the
runtime (runtime.py) and its settings, never from another part: they meet only through the book and the inbox.

    admission   submit, the queue and its discipline (admission.py)
    runs        place, start, follow, end, stop (runs.py)
    recovery    a loss reconciled step by step (recovery.py)
    detector    engines, links, silent and hung ranks, stragglers; the ticker and the engine watcher (detect.py)
    warm        warm spares (warm.py)
    regrouper   one job, or all of them at once (regroup.py)
    external    jobs an outside scheduler placed (external.py)
    restart     reconciling every job after a restart (restart.py)
    records     forget, prune (records.py)

Built from what it needs, handed in by the controller's wiring (controller/apps/context.py), or by a test:

    state       the rack state (controller/state.py): rack, circuits and their version, events, store, clock
    changes     the circuit-change port (ports.CircuitChangesPort; controller/devices/changes.py)
    containers  the containers port (ports.ContainersPort; controller/drivers/containers.py)
    runtime     threads, sleeps, locks (runtime.Runtime; Ryu's hub in the controller, virtual time in tests)
    scheduler   the outside scheduler of external jobs (ports.SchedulerPort; controller/slurm/), if any
"""

from __future__ import annotations

import builtins

from controller.core import placement as policy
from controller.core.circuits import CircuitMap
from controller.core.jobs import Job, JobRequest
from controller.core.rack import PortRef
from controller.jobs.admission import Admission
from controller.jobs.book import JobBook
from controller.jobs.detect import Detector
from controller.jobs.external import External
from controller.jobs.inbox import (
    Call,
    Drain,
    End,
    EngineChanged,
    Inbox,
    LinkChanged,
    Lost,
    Reply,
    Tick,
    WorkerEnded,
    WorkerLine,
)
from controller.jobs.loop import Loop
from controller.jobs.ports import AggregatorsPort, CircuitChangesPort, ContainersPort, SchedulerPort
from controller.jobs.records import Records
from controller.jobs.recovery import Recovery
from controller.jobs.regroup import Regroup
from controller.jobs.restart import Restart
from controller.jobs.runs import Runs
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG_LINES
from controller.jobs.warm import Warm


class JobService:
    def __init__(self, state, changes: CircuitChangesPort, containers: ContainersPort, runtime: Runtime,
                 engine_poll: float, hold_configuring: bool = False, hold_recovering: str | None = None,
                 keep_survivors: bool = True, scheduler: SchedulerPort | None = None, queue: str = "fifo",
                 aggregators: AggregatorsPort | None = None):
        self.state, self.rt, self.containers = state, runtime, containers
        self.book = book = JobBook(state)
        self.inbox = inbox = Inbox(runtime)
        self.admission = Admission(book, inbox, runtime, containers, queue)
        self.runs = Runs(book, inbox, runtime, changes, containers, hold_configuring, aggregators)
        self.recovery = Recovery(book, inbox, runtime, changes, containers, hold_recovering, keep_survivors,
                                 aggregators)
        self.detector = Detector(book, inbox, runtime, containers, scheduler, engine_poll)
        self.warm = Warm(book, inbox, runtime, containers, enabled=keep_survivors)
        self.regrouper = Regroup(book, inbox, runtime, changes)
        self.external = External(book, inbox, runtime, changes)
        self.restart = Restart(book, inbox, runtime, changes, containers, scheduler)
        self.records = Records(book, inbox)
        self.loop = Loop(
            inbox,
            book,
            handlers={
                WorkerLine: [self.runs.line],
                WorkerEnded: [self.runs.worker_ended],
                EngineChanged: [self.detector.engine_changed],
                LinkChanged: [self.detector.link_changed],
                Tick: [self.detector.tick, self.recovery.tick],
                Lost: [self.recovery.lost],
                End: [self.runs.end],
                Drain: [self.recovery.drain, self.admission.drain, self.warm.drain],
            },
            steps={"admission": self.admission, "runs": self.runs, "recovery": self.recovery,
                   "detect": self.detector, "warm": self.warm, "regroup": self.regrouper, "external": self.external,
                   "restart": self.restart, "records": self.records},
            reconcilers={  # by the job's kind (Job.kind) and state; an external job's ranks are its scheduler's
                ("containers", "pending"): [self.runs.reconcile],
                ("containers", "configuring"): [self.runs.reconcile],
                ("containers", "running"): [self.runs.reconcile, self.warm.reconcile],
                ("containers", "recovering"): [self.recovery.reconcile],
            },
        )

    def start(self, restart: bool = True) -> None:
        """Its threads (the loop, the ticker, the engine watcher); then (`restart`) every job it finds is reconciled."""
        self.rt.spawn(self.loop.run)
        self.detector.start()
        if restart:
            self.inbox.post(Call("restart.begin"))

    def _call(self, what: str, *args):
        """Post an API call to the loop and wait for its answer (its error raised here)."""
        reply = Reply(self.rt)
        self.inbox.post(Call(what, args, reply))
        return reply.wait()

    # --- the facade ---------------------------------------------------------------------------
    def submit(self, req: JobRequest) -> Job:
        """Placed at once (started in the background) or queued; raises policy.InvalidRequest, policy.NoRoomNow (not
        now and not queued), policy.PlacementError (never on this rack), Conflict (an engine named is down)."""
        down: dict[str, str] = {}
        if isinstance(req.gpus, list) and set(req.gpus) <= set(self.state.rack.gpus):
            for s in sorted({self.state.rack.server_of[g] for g in req.gpus}):  # asked here, not in the loop
                if not self.containers.engines.ping(s):
                    down[s] = self.containers.down_servers().get(s, "it does not answer")
        return self._call("admission.submit", req, down)

    def stop(self, job_id: str) -> Job:
        """Stop a queued, running or recovering job (an ended one is returned as it is); Conflict while placed."""
        return self._call("runs.stop", job_id)

    def regroup(self, job_id: str):
        """A running job's GPUs under fewer switches: (the event or None, what happened in words)."""
        return self._call("regroup.regroup", job_id)

    def regroup_all(self, dry_run: bool = False, version: int | None = None) -> dict:
        """Defragment: every running job regrouped in one change (`dry_run`: the plan; `version`: apply that plan)."""
        return self._call("regroup.regroup_all", dry_run, version)

    def begin_external(self, scheduler: str, job_id: str, user: str, gpus: list[str], hold: bool = False,
                       policy_name: str = "regroup") -> Job:
        """A job a scheduler outside placed (Slurm's prolog): its GPUs regrouped under one switch and held, no
        container started (external.py); raises policy.InvalidRequest, Conflict (held, or not regroupable with hold)."""
        return self._call("external.begin", scheduler, job_id, user, gpus, hold, policy_name)

    def end_external(self, scheduler: str, job_id: str, state: str) -> Job:
        """That job ended outside: its GPUs and circuits are released (UnknownJob if it was never placed)."""
        return self._call("external.end", scheduler, job_id, state)

    def get(self, job_id: str) -> Job:
        """The job (UnknownJob if there is none of that id)."""
        return self.book.get(job_id)

    def list(self, limit: int, before: str | None = None, states: set[str] | None = None):
        """A page of jobs, oldest first, and the id to ask `before` for the page before it (None: no older job)."""
        return self.book.page(limit, before, states)

    def delete(self, job_id: str) -> Job:
        """Stop the job if it runs, then forget it; its last record."""
        self.stop(job_id)
        return self._call("records.forget", job_id)

    def prune(self, older_than_s: float | None, keep: int | None) -> builtins.list[str]:
        """Forget finished jobs that ended more than `older_than_s` ago, keeping the newest `keep`; their ids."""
        return self._call("records.prune", older_than_s, keep)

    def logs(self, job: Job, tail: int = LOG_LINES) -> tuple[dict[str, builtins.list[str]], str]:
        """A running job's live log lines, else those kept when it ended; and which."""
        return self.runs.workers.logs(job, tail)

    # --- what other parts read, and hand in ------------------------------------------------------------
    @property
    def jobs(self):
        return self.book.jobs

    def busy_gpus(self) -> dict[str, str]:
        return self.book.busy_gpus()

    def protected_ports(self, exclude: str | None = None, circuits: CircuitMap | None = None) -> dict[PortRef, str]:
        return self.book.protected_ports(exclude, circuits)

    def down_servers(self) -> dict[str, str]:
        return {**self.containers.down_servers(), **self.book.down}

    def fragmentation(self) -> dict:
        return policy.fragmentation(self.book.occ())

    def link_changed(self, port: PortRef, up: bool) -> None:
        """The OCS reported a port's link up or down (a GPU's NIC: its job loses that GPU)."""
        self.inbox.post(LinkChanged(str(port), up))




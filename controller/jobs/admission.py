"""Admission: a job submitted is admitted at once (its GPUs reserved: `pending`, which runs.py places) or queued, and
the queue is drained as GPUs free up, in the order of the controller's discipline (`--optirack-queue`): the policies of
controller/core/admission.py, the simulator's own: `fifo` (first in, first out, the default), `backfill` (EASY
backfilling) and `sjf` (shortest estimated job first), the last two by each job's `estimate_s`, which they require.
`las` is not offered: it preempts (checkpoint, stop, requeue, resume), which the simulator models and the controller
does not do. Steps of the loop: `submit` answers its caller, `drain` takes every Drain."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from controller.core import admission
from controller.core import placement as policy
from controller.core.errors import Conflict
from controller.core.jobs import ACTIVE, QUEUED, Job, JobRequest, transition
from controller.jobs import aggregation
from controller.jobs.book import JobBook
from controller.jobs.inbox import Inbox, Reconcile, Reply
from controller.jobs.ports import ContainersPort
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG

DISCIPLINES = ("fifo", "backfill", "sjf")  # las: the simulator's only (it preempts)
CANDIDATE = ""  # the key of a job being submitted, before it has an id


class Queued:
    """The controller's jobs as the core's policies see a cluster (controller.core.admission.Cluster): free GPUs, each
    job's size and estimate (`estimate_s`; a running job's, less the time since its GPUs were granted; a job without
    one, submitted under fifo, ends never); `new`: a job being submitted, under the key CANDIDATE."""

    def __init__(self, book: JobBook, free: Callable[[], int], new: Job | None = None):
        self.book, self.now, self._free, self._new = book, book.clock(), free, new

    def _job(self, job_id: str) -> Job:
        return self._new if job_id == CANDIDATE and self._new is not None else self.book.jobs[job_id]

    def free(self) -> int:
        return self._free()

    def gpus(self, job_id: str) -> int:
        g = self._job(job_id).request["gpus"]
        return g if isinstance(g, int) else len(g)

    def estimate(self, job_id: str) -> float:
        job = self._job(job_id)
        e = job.request.get("estimate_s")
        length = float("inf") if e is None else float(e)
        if job.state in ACTIVE:
            return max(0.0, (job.admitted_at or job.created_at) + length - self.now)
        return length

    def attained(self, job_id: str) -> float:
        return 0.0  # only las asks, and the controller does not offer it

    def running(self) -> list[admission.Running]:
        return [admission.Running(j.id, len(j.gpus), self.now + self.estimate(j.id), 0.0, False)
                for j in self.book.jobs.live.values() if j.state in ACTIVE and j.gpus]

    def preempt(self, job_id: str) -> None:
        raise NotImplementedError("the controller does not preempt (las is the simulator's only)")


class Admission:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, containers: ContainersPort, discipline: str = "fifo"):
        if discipline not in DISCIPLINES:
            raise ValueError(f"queue discipline {discipline!r} is not one of {', '.join(DISCIPLINES)}")
        self.book, self.inbox, self.rt, self.containers = book, inbox, rt, containers
        self.discipline = discipline

    def occ(self, exclude: str | None = None):
        """The occupancy now, as a new job sees it: the GPUs of servers that are down count as held."""
        down = set(self.book.down) | set(self.containers.down_servers())
        return self.book.occ(exclude=exclude, down=down)

    def submit(self, reply: Reply, req: JobRequest, down: dict[str, str]) -> None:
        """Admit a job: placed at once (its GPUs reserved, placed by the loop), or queued; answers the Job. Raises
        policy.InvalidRequest (bad input), policy.NoRoomNow (cannot be placed now and `queue` is false),
        policy.PlacementError (this rack can never place it) or Conflict (a server named is down: `down`, as its
        caller found them, server -> why); nothing changes then."""
        book = self.book
        if self.discipline != "fifo" and req.estimate_s is None:
            raise policy.InvalidRequest(f"required: this controller queues by {self.discipline}, which needs the "
                                        "seconds the job is expected to run", "estimate_s")
        job = Job(id="", request=req.model_dump(), created_at=book.clock())
        if isinstance(req.gpus, list) and set(req.gpus) <= set(book.rack.gpus):
            self._refuse_down(req.gpus, down)  # 409 naming the server, not a wait in the queue
        try:
            p, agg = aggregation.plan(book, self.occ(), job)
        except policy.NoRoomNow as e:
            p, agg, wait = None, None, str(e)
        if p is not None and book.queue and not self._overtakes(job):
            p, wait = None, f"{len(book.queue)} queued job(s) ahead ({self.discipline})"
        elif p is not None and book.awaiting:
            p, wait = None, f"{len(book.awaiting)} recovering job(s) waiting for spares ahead of it"
        if p is None and not req.queue:
            raise policy.NoRoomNow(f"{wait}; not queued (queue: false)")
        job.id = book.new_id()
        book.jobs[job.id] = job
        if p is None:
            transition(job, QUEUED, note=f"waiting: {wait}")
            book.queue.append(job.id)
            book.number_queue()
            book.save(job)
            LOG.info("%s queued at position %d: %s", job.id, job.position, wait)
        else:
            self._admit(job, p, agg)
        reply.set(job)

    def _overtakes(self, job: Job) -> bool:
        """Whether the discipline starts `job`, which fits now, before the jobs that wait: its policy run on the queue
        with `job` last, where the jobs that wait still wait (each drain left them so) and nothing changes. Never under
        fifo."""
        if self.discipline == "fifo":
            return False
        started = []

        def attempt(job_id: str) -> admission.Outcome:
            if job_id != CANDIDATE:
                return admission.Outcome.WAIT
            started.append(job_id)
            return admission.Outcome.PLACED

        self._policy(deque([*self.book.queue, CANDIDATE]), attempt, Queued(self.book, self._free, job))
        return bool(started)

    def _free(self) -> int:
        return sum(self.occ().free_model)

    @property
    def _policy(self) -> Callable[..., None]:
        return admission.POLICIES[self.discipline]

    def _admit(self, job: Job, p: policy.Plan, agg: dict | None) -> None:
        """Its GPUs reserved (pending), and its aggregator's room where it aggregates (aggregation.py)."""
        transition(job, "pending", gpus=list(p.gpus), switches=list(p.switches), note=p.note,
                   admitted_at=self.book.clock(), aggregation=agg)
        self.book.admitted[job.id] = p
        self.book.save()
        LOG.info("%s admitted: %d GPUs %s, policy %s; %s", job.id, len(p.gpus), ",".join(p.gpus),
                 job.request["policy"], p.note)
        self.inbox.post(Reconcile(job.id))  # placed by runs.py

    def drain(self, _=None) -> None:
        """Start queued jobs in the order of the discipline (fifo: in order of arrival, while the first one can be
        placed); none while a recovering job waits for spares at the head of the queue: it takes them first."""
        book = self.book
        if book.awaiting or not book.queue:
            return

        def attempt(job_id: str) -> admission.Outcome:
            job = book.jobs[job_id]
            try:
                p, agg = aggregation.plan(book, self.occ(), job)
            except policy.NoRoomNow as e:
                job.note = f"waiting: {e}"
                return admission.Outcome.WAIT
            except policy.PlacementError as e:  # the rack changed under it: it can never run
                transition(job, "failed", reason=str(e), ended_at=book.clock(), position=None)
                book.save(job)
                return admission.Outcome.REFUSED
            job.position = None
            self._admit(job, p, agg)
            return admission.Outcome.PLACED

        self._policy(book.queue, attempt, Queued(book, self._free))
        book.number_queue()
        book.save()

    def _refuse_down(self, gpus: list[str], down: dict[str, str]) -> None:
        """409 naming the server, for GPUs whose server is down (asked by the caller, or observed so)."""
        server_of = self.book.rack.server_of
        servers = sorted({server_of[g] for g in gpus})
        down = {s: down.get(s) or self.book.down[s] for s in servers if s in down or s in self.book.down}
        if down:
            raise Conflict("gpus: " + "; ".join(
                f"the Docker Engine of server {s} is down ({why}): {', '.join(g for g in gpus if server_of[g] == s)} "
                "cannot run" for s, why in down.items()))

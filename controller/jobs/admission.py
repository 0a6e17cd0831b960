"""Admission: a job submitted is admitted at once (its GPUs reserved: `pending`, which runs.py places) or queued (first
in, first out), and the queue is drained as GPUs free up. Steps of the loop: `submit` answers its caller, `drain` takes
every Drain."""

from __future__ import annotations

from controller.core import admission
from controller.core import placement as policy
from controller.core.errors import Conflict
from controller.core.jobs import QUEUED, Job, JobRequest, transition
from controller.jobs.book import JobBook
from controller.jobs.inbox import Inbox, Reconcile, Reply
from controller.jobs.ports import ContainersPort
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG, request_of


class Admission:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, containers: ContainersPort):
        self.book, self.inbox, self.rt, self.containers = book, inbox, rt, containers

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
        job = Job(id="", request=req.model_dump(), created_at=book.clock())
        if isinstance(req.gpus, list) and set(req.gpus) <= set(book.rack.gpus):
            self._refuse_down(req.gpus, down)  # 409 naming the server, not a wait in the queue
        try:
            p = policy.plan(self.occ(), request_of(job))
        except policy.NoRoomNow as e:
            p, wait = None, str(e)
        if p is not None and book.queue:
            p, wait = None, f"{len(book.queue)} queued job(s) ahead (first in, first out)"
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
            self._admit(job, p)
        reply.set(job)

    def _admit(self, job: Job, p: policy.Plan) -> None:
        transition(job, "pending", gpus=list(p.gpus), switches=list(p.switches), note=p.note,
                   admitted_at=self.book.clock())
        self.book.admitted[job.id] = p
        self.book.save()
        LOG.info("%s admitted: %d GPUs %s, policy %s; %s", job.id, len(p.gpus), ",".join(p.gpus),
                 job.request["policy"], p.note)
        self.inbox.post(Reconcile(job.id))  # placed by runs.py

    def drain(self, _=None) -> None:
        """Start queued jobs, in order of arrival, while the first one can be placed (none while a recovering job waits
        for spares at the head of the queue: it takes them first)."""
        book = self.book
        if book.awaiting or not book.queue:
            return

        def attempt(job_id: str) -> admission.Outcome:
            job = book.jobs[job_id]
            try:
                p = policy.plan(self.occ(), request_of(job))
            except policy.NoRoomNow as e:
                job.note = f"waiting: {e}"
                return admission.Outcome.WAIT
            except policy.PlacementError as e:  # the rack changed under it: it can never run
                transition(job, "failed", reason=str(e), ended_at=book.clock(), position=None)
                book.save(job)
                return admission.Outcome.REFUSED
            job.position = None
            self._admit(job, p)
            return admission.Outcome.PLACED

        admission.fifo(book.queue, attempt)
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

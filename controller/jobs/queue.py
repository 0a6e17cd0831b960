"""Submitting a job: admitted at once or queued (first in, first out), and the queue drained as GPUs free up."""

from __future__ import annotations

from collections.abc import Callable

from controller.core import admission
from controller.core import placement as policy
from controller.core.jobs import QUEUED, Job, JobRequest, transition
from controller.jobs.errors import Conflict
from controller.jobs.steps import LOG, request_of


class Queue:
    def __init__(self, book, state, changes, containers, runtime, run: Callable):
        self.book, self.state, self.changes, self.containers, self.rt = book, state, changes, containers, runtime
        self.run = run  # the job's thread (lifecycle.Lifecycle.run), given the job and its admission's plan
        self.lock = runtime.lock()  # admission (submit and the queue) one job at a time

    def occ(self, exclude: str | None = None):
        """The occupancy now, as a new job sees it: the GPUs of servers whose engine is down count as held."""
        return self.book.occ(exclude=exclude, down=self.containers.down_servers())

    def submit(self, req: JobRequest) -> Job:
        """Admit a job: placed at once (its GPUs reserved, started in the background), or queued.

        Raises policy.InvalidRequest (bad input), policy.NoRoomNow (cannot be placed now and
        `queue` is false) or policy.PlacementError (this rack can never place it); nothing changes then.
        """
        book = self.book
        job = Job(id="", request=req.model_dump(), created_at=self.state.clock())
        if isinstance(req.gpus, list) and set(req.gpus) <= set(self.state.rack.gpus):
            self._refuse_down_engines(req.gpus)  # 409 naming the server, not a wait in the queue
        with self.lock:
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
        return job

    def _admit(self, job: Job, p: policy.Plan) -> None:
        transition(
            job, "pending", gpus=list(p.gpus), switches=list(p.switches), note=p.note, admitted_at=self.state.clock()
        )
        self.book.save()
        LOG.info(
            "%s admitted: %d GPUs %s, policy %s; %s",
            job.id,
            len(p.gpus),
            ",".join(p.gpus),
            job.request["policy"],
            p.note,
        )
        self.rt.spawn(self.run, job, p)

    def drain(self) -> None:
        """Start queued jobs, in order of arrival, while the first one can be placed."""
        book = self.book

        def attempt(job_id: str) -> admission.Outcome:
            job = book.jobs[job_id]
            try:
                p = policy.plan(self.occ(), request_of(job))
            except policy.NoRoomNow as e:
                job.note = f"waiting: {e}"
                return admission.Outcome.WAIT
            except policy.PlacementError as e:  # the rack changed under it: it can never run
                transition(job, "failed", reason=str(e), ended_at=self.state.clock(), position=None)
                book.save(job)
                return admission.Outcome.REFUSED
            job.position = None
            self._admit(job, p)
            return admission.Outcome.PLACED

        if book.awaiting:
            return  # a recovering job waiting for spares comes first: it takes them when it tries again
        with self.lock:
            admission.fifo(book.queue, attempt)
            book.number_queue()
            book.save()

    def drain_when_ready(self, timeout: float = 60.0) -> None:
        """After a restart: start queued jobs once every OCS is back in sync (or after `timeout` s)."""
        self.wait_for_devices(timeout)
        self.drain()

    def wait_for_devices(self, timeout: float) -> bool:
        """Wait until every OCS is connected and holds our circuits (at most `timeout` s); whether they are."""
        waited = 0.0
        while not self.changes.ready():
            if waited >= timeout:
                return False
            self.rt.sleep(0.2)
            waited += 0.2
        return True

    def stop_queued(self, job: Job) -> None:
        with self.lock:
            self.book.queue.remove(job.id)
            transition(job, "stopped", reason="stopped while queued", ended_at=self.state.clock(), position=None)
            self.book.number_queue()
            self.book.save(job)
        self.drain()  # the next one may fit now

    def _refuse_down_engines(self, gpus: list[str]) -> None:
        """409 naming the server, for GPUs whose server's engine does not answer now."""
        server_of = self.state.rack.server_of
        servers = sorted({server_of[g] for g in gpus})
        down = {s: self.containers.down_servers()[s] for s in servers if not self.containers.engines.ping(s)}
        if down:
            raise Conflict(
                "gpus: "
                + "; ".join(
                    f"the Docker Engine of server {s} is down ({why}): "
                    f"{', '.join(g for g in gpus if server_of[g] == s)} cannot run"
                    for s, why in down.items()
                )
            )

"""After a restart, as a Kubernetes controller does: every active job is posted to the loop (`Reconcile`), which
brings it to where it should be from its record and what the devices hold now, the same way as any other event:
a `running` job's workers still there are followed again and one that went away while the controller was down is a
loss the recovery takes (runs.py); a `configuring` one is carried on if its circuits and containers match its plan,
else undone; a `pending` one is placed; a `recovering` one has its recovery carried on after its servers are observed
again (recovery.py); an external one is asked of its scheduler (it ended meanwhile: released). Every server is swept
of what jobs that are over left there, and the queue is tried once the OCS are back in step."""

from __future__ import annotations

from controller.core.jobs import ACTIVE
from controller.jobs.actions import Actions
from controller.jobs.book import JobBook
from controller.jobs.inbox import Done, Drain, End, Inbox, Reconcile, Reply
from controller.jobs.ports import CircuitChangesPort, ContainersPort, SchedulerPort
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG
from controller.jobs.workers import Workers

DEVICES_WAIT = 60.0  # seconds the queue waits for the OCS after a restart before it is tried anyway


class Restart:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, changes: CircuitChangesPort,
                 containers: ContainersPort, scheduler: SchedulerPort | None = None):
        self.book, self.inbox, self.rt, self.changes, self.scheduler = book, inbox, rt, changes, scheduler
        self.workers = Workers(book, containers, inbox, rt)
        self.actions = Actions(book, inbox, rt)

    def begin(self, reply: Reply | None = None) -> None:
        """Every active job to the loop; every server swept; the queue once the OCS are back."""
        for job in [j for j in self.book.jobs.values() if j.active]:
            if job.state == "recovering":
                self.book.resuming.add(job.id)
            self.inbox.post(Reconcile(job.id))  # what reconciles it is its kind's and state's (service.py)
        external = [j.request["external"]["job"] for j in self.book.of("external", *ACTIVE)]
        for server in self.book.rack.servers:
            self.actions.start(server, "restart.swept", self.workers.sweep, server, tracked=False)
        if external and self.scheduler is not None:
            self.actions.start("scheduler", "restart.asked", self.scheduler.ended, external, tracked=False)
        if self.book.queue:
            self.actions.start("queue", "restart.ready", self._wait_for_devices, tracked=False)
        if reply is not None:
            reply.set(None)

    def swept(self, done: Done) -> None:
        if done.error is not None:
            LOG.error("cannot remove stale containers on %s: %s", done.job, done.error)
        elif done.result:
            LOG.warning("removed stale containers of GPUs %s on %s", ", ".join(done.result), done.job)

    def asked(self, done: Done) -> None:
        """The scheduler says which of its jobs ended while the controller was down: they are released."""
        if done.error is not None:
            LOG.error("asking the scheduler which of its jobs ended: %s", done.error)
            return
        for job in self.book.of("external", *ACTIVE):
            state = done.result.get(job.request["external"]["job"])
            if state is not None:
                LOG.info("%s ended while the controller was down (%s): released", job.id, state)
                job.request["external"]["state"] = state  # as an end told by the scheduler's hook records it
                word = state.split()[0].upper()
                final = {"COMPLETED": "done", "CANCELLED": "stopped"}.get(word, "failed")
                self.inbox.post(End(job.id, final, None if final == "done" else f"{state} (while the controller "
                                                                                  "was down)"))

    def _wait_for_devices(self) -> bool:
        waited = 0.0
        while not self.changes.ready() and waited < DEVICES_WAIT:
            self.rt.sleep(0.2)
            waited += 0.2
        return self.changes.ready()

    def ready(self, done: Done) -> None:
        if done.error is None and not done.result:
            LOG.error("the OCS are not back after %.0f s; trying the queue without them", DEVICES_WAIT)
        self.inbox.post(Drain())

"""Reconciling, as a Kubernetes controller does: after a restart, each job found active is brought to where it should
be by comparing its record with what the engines and the OCS hold. A job found `running` whose workers are all there
is followed again (else it fails, naming the missing ones); one found `configuring` is carried on to `running` if
its circuits and containers match its plan, else undone (its placement's circuits put back, its containers removed,
failed with the reason); one found `recovering` has its recovery carried on from the step its record says, once the
OCS are back (failover.py); one found `pending` fails (it held nothing yet); a `queued` one keeps its place. When a
server's engine comes back, what is left there of ended jobs is removed and the queue is tried again.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.core.circuits import CircuitDiff, CircuitError, CircuitMap
from controller.core.jobs import ACTIVE, Job, transition
from controller.jobs.external import is_external
from controller.jobs.steps import LOG

DEVICES_WAIT = 60.0  # seconds a restarted controller waits for the OCS before it undoes a configuring job


class Recovery:
    def __init__(
        self, book, state, containers, workers, lifecycle, runtime, engine_poll: float,
        wait_for_devices: Callable[[float], bool], drain: Callable[[], None], resume: Callable[[Job], None],
    ):  # fmt: skip
        self.book, self.state, self.containers, self.workers, self.lifecycle, self.rt = (
            book, state, containers, workers, lifecycle, runtime
        )  # fmt: skip
        self.engine_poll = engine_poll
        self.wait_for_devices = wait_for_devices  # queue.Queue.wait_for_devices
        self.drain = drain  # start queued jobs (queue.Queue.drain)
        self.resume = resume  # carry a recovery on (failover.Failover.resume)

    # --- after a restart --------------------------------------------------------------------
    def found(self) -> list[tuple[Job, str]]:
        """The jobs active at start, with their states: what `recover` reconciles (taken before any thread runs, so
        that a job submitted meanwhile, or admitted when ending another drains the queue, is not taken for one the
        restart interrupted)."""
        return [(job, job.state) for job in self.book.jobs.values() if job.state in ACTIVE]

    def recover(self, found: list[tuple[Job, str]]) -> None:
        """After a restart: follow running jobs whose workers are all still there, on every engine;
        fail the others; then remove what is left of jobs that are over, and carry on the recoveries under way."""
        recovering = []
        for job, state in found:
            if job.state != state:
                continue
            if is_external(job):
                continue  # its ranks are the outside scheduler's, which ends it (external.py)
            if job.state == "running":
                present = self.workers.present(job)
                if set(present) == set(job.gpus):
                    LOG.info("%s: its workers are still there after the restart; following them again", job.id)
                    self.rt.spawn(self.lifecycle.watch, job)
                    continue
                missing = ", ".join(sorted(set(job.gpus) - set(present)))
                self.lifecycle.fail(job, f"the workers of {missing} went away while the controller was down", None)
            elif job.state == "configuring":
                self._reconcile_configuring(job)
            elif job.state == "recovering":
                recovering.append(job)  # after the sweep: it must not take the containers the recovery starts
            elif job.state in ACTIVE:
                self.lifecycle.fail(job, f"the controller restarted while the job was {job.state}", None)
        for server in self.state.rack.servers:
            self.sweep(server)
        for job in recovering:
            self.rt.spawn(self._resume, job)

    def _resume(self, job: Job) -> None:
        if not self.wait_for_devices(DEVICES_WAIT):
            LOG.error("%s: the OCS are not back after %.0f s; recovering without them", job.id, DEVICES_WAIT)
        if job.state == "recovering":
            self.resume(job)

    def _reconcile_configuring(self, job: Job) -> None:
        """Carry the job on if what the devices hold is its plan: its circuits in the map, a worker per GPU on the
        engines; else undo it."""
        why = self._placement_mismatch(job)
        if why is None:
            LOG.info("%s: configuring at the restart, its circuits and containers in place: carrying on", job.id)
            transition(job, "running", started_at=self.state.clock())
            self.book.save()
            self.rt.spawn(self.lifecycle.watch, job)
            return
        LOG.warning("%s: configuring at the restart, but %s: undoing it", job.id, why)
        if not self.wait_for_devices(DEVICES_WAIT):
            LOG.error("%s: the OCS are not back after %.0f s; undoing without them", job.id, DEVICES_WAIT)
        why = f"the controller restarted while the job was configuring, and {why}"
        self.lifecycle.fail(job, why, self._placed(job))

    def _placement_mismatch(self, job: Job) -> str | None:
        """Why the devices do not hold `job`'s plan (None: they do)."""
        if not job.gpus or len(job.circuits) != len(job.gpus):
            return "its placement had not been recorded"
        held = {frozenset(str(p) for p in c) for c in self.state.circuits.circuits}
        changed = [c for c in job.circuits if frozenset(c) not in held]
        if changed:
            return f"its circuit {changed[0][0]}-{changed[0][1]} is gone"
        missing = sorted(set(job.gpus) - set(self.workers.present(job)))
        if missing:
            return f"the containers of {', '.join(missing)} are gone"
        return None

    def _placed(self, job: Job) -> CircuitDiff | None:
        """The circuits the job's placement changed, from its last placement event (None: it changed none)."""
        placed = [e for e in self.state.events.recent() if e.job == job.id and e.kind == "job" and e.status == "ok"]
        if not placed:
            return None
        ev, rack = placed[-1], self.state.rack
        try:
            removed, added = CircuitMap.parse(rack, ev.removed), CircuitMap.parse(rack, ev.added)
        except CircuitError as e:  # the rack file changed since
            LOG.error("%s: its placement event no longer fits the rack (%s); circuits left as they are", job.id, e)
            return None
        return CircuitDiff(frozenset(removed.circuits), frozenset(added.circuits))

    # --- the servers' engines -------------------------------------------------------------------
    def down_servers(self) -> dict[str, str]:
        """Servers whose Docker Engine did not answer when last asked: server -> why."""
        return self.containers.down_servers()

    def watch_engines(self) -> None:
        """Ask every engine now and then; one that comes back gets its stale containers removed."""
        while True:
            self.rt.sleep(self.engine_poll)
            for server in self.state.rack.servers:
                self.containers.engines.ping(server)
            for server in self.containers.engines.returning():  # shown down until swept: nobody uses it before
                if self.sweep(server):
                    self.containers.engines.mark_up(server)
                    try:
                        self.drain()  # its GPUs can take queued jobs again
                    except Exception:  # noqa: BLE001 (the watch goes on; the next job's end drains again)
                        LOG.exception("starting queued jobs after the engine of %s came back", server)

    def sweep(self, server: str) -> bool:
        """Remove what is left on `server` of jobs that are over, and of GPUs a job that goes on lost there;
        whether that was done. It holds the server's GPUs (workers.owning) from deciding what is stale to the end, so
        a job starting there meanwhile, or a warm spare started or evicted, is never removed twice nor taken for
        stale; the warm spares this controller keeps are not stale."""
        rack = self.state.rack
        with self.workers.owning([g for g in rack.gpus if rack.server_of[g] == server]):
            keep = {j.id for j in self.book.jobs.values() if j.active}
            pairs = {(j.id, g) for j in self.book.jobs.values() if j.active for g in j.gpus}
            pairs |= {(j, g) for g, j in self.workers.warm.items() if j in keep}
            try:
                gone = self.containers.sweep(server, keep, pairs)
            except Exception as e:  # noqa: BLE001 (down again: the next poll retries)
                LOG.error("cannot remove stale containers on %s: %s", server, e)
                return False
        if gone:
            LOG.warning("removed stale containers of GPUs %s on %s", ", ".join(gone), server)
        return True

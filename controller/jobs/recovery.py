"""Reconciling, as a Kubernetes controller does: after a restart, each job found active is brought to where it should
be by comparing its record with what the engines and the OCS hold. A job found `running` whose workers are all there
is followed again (else it fails, naming the missing ones); one found `configuring` is carried on to `running` if
its circuits and containers match its plan, else undone (its placement's circuits put back, its containers removed,
failed with the reason); one found `pending` fails (it held nothing yet); a `queued` one keeps its place. When a
server's engine comes back, what is left there of ended jobs is removed and the queue is tried again.
"""

from __future__ import annotations

from controller.core.circuits import CircuitDiff, CircuitError, CircuitMap
from controller.core.jobs import ACTIVE, Job, transition
from controller.jobs.steps import LOG

DEVICES_WAIT = 60.0  # seconds a restarted controller waits for the OCS before it undoes a configuring job


class RecoveryMixin:
    # --- after a restart --------------------------------------------------------------------
    def _recover(self) -> None:
        """After a restart: follow running jobs whose workers are all still there, on every engine;
        fail the others; then remove what is left of jobs that are over."""
        # The states found at start: ending one job drains the queue, which admits queued jobs that must not be
        # taken for jobs the restart interrupted.
        found = [(job, job.state) for job in self.jobs.values() if job.state in ACTIVE]
        for job, state in found:
            if job.state != state:
                continue
            if job.state == "running":
                present = self._present(job)
                if set(present) == set(job.gpus):
                    LOG.info("%s: its workers are still there after the restart; following them again", job.id)
                    self.rt.spawn(self._watch, job)
                    continue
                missing = ", ".join(sorted(set(job.gpus) - set(present)))
                self._fail(job, f"the workers of {missing} went away while the controller was down", None)
            elif job.state == "configuring":
                self._reconcile_configuring(job)
            elif job.state in ACTIVE:
                self._fail(job, f"the controller restarted while the job was {job.state}", None)
        for server in self.ctx.rack.servers:
            self._sweep(server)

    def _reconcile_configuring(self, job: Job) -> None:
        """Carry the job on if what the devices hold is its plan: its circuits in the map, a worker per GPU on the
        engines; else undo it."""
        why = self._placement_mismatch(job)
        if why is None:
            LOG.info("%s: configuring at the restart, its circuits and containers in place: carrying on", job.id)
            transition(job, "running", started_at=self.ctx.clock())
            self.save()
            self.rt.spawn(self._watch, job)
            return
        LOG.warning("%s: configuring at the restart, but %s: undoing it", job.id, why)
        if not self._wait_for_devices(DEVICES_WAIT):
            LOG.error("%s: the OCS are not back after %.0f s; undoing without them", job.id, DEVICES_WAIT)
        self._fail(job, f"the controller restarted while the job was configuring, and {why}", self._placed(job))

    def _placement_mismatch(self, job: Job) -> str | None:
        """Why the devices do not hold `job`'s plan (None: they do)."""
        if not job.gpus or len(job.circuits) != len(job.gpus):
            return "its placement had not been recorded"
        held = {frozenset(str(p) for p in c) for c in self.ctx.circuits.circuits}
        changed = [c for c in job.circuits if frozenset(c) not in held]
        if changed:
            return f"its circuit {changed[0][0]}-{changed[0][1]} is gone"
        missing = sorted(set(job.gpus) - set(self._present(job)))
        if missing:
            return f"the containers of {', '.join(missing)} are gone"
        return None

    def _placed(self, job: Job) -> CircuitDiff | None:
        """The circuits the job's placement changed, from its last placement event (None: it changed none)."""
        placed = [e for e in self.ctx.events.recent() if e.job == job.id and e.kind == "job" and e.status == "ok"]
        if not placed:
            return None
        ev, rack = placed[-1], self.ctx.rack
        try:
            removed, added = CircuitMap.parse(rack, ev.removed), CircuitMap.parse(rack, ev.added)
        except CircuitError as e:  # the rack file changed since
            LOG.error("%s: its placement event no longer fits the rack (%s); circuits left as they are", job.id, e)
            return None
        return CircuitDiff(frozenset(removed.circuits), frozenset(added.circuits))

    def _present(self, job: Job) -> list[str]:
        """The GPUs of `job` whose worker is still on its server's engine: running, or exited while
        the controller was down (its exit code and output still say how it ended, and following it
        records that)."""
        found = []
        for server in sorted({self.ctx.rack.server_of[g] for g in job.gpus}):
            try:
                found += [w["gpu"] for w in self.driver.workers(server, job.id) if w["role"] == "worker"]
            except Exception as e:  # noqa: BLE001 (engine unreachable: its workers count as gone)
                LOG.error("cannot list containers on %s: %s", server, e)
        return found

    # --- the servers' engines -------------------------------------------------------------------
    def down_servers(self) -> dict[str, str]:
        """Servers whose Docker Engine did not answer when last asked: server -> why."""
        return self.driver.down_servers()

    def _watch_engines(self) -> None:
        """Ask every engine now and then; one that comes back gets its stale containers removed."""
        while True:
            self.rt.sleep(self.engine_poll)
            for server in self.ctx.rack.servers:
                self.driver.engines.ping(server)
            for server in self.driver.engines.returning():  # shown down until swept: nobody uses it before
                if self._sweep(server):
                    self.driver.engines.mark_up(server)
                    try:
                        self._drain_queue()  # its GPUs can take queued jobs again
                    except Exception:  # noqa: BLE001 (the watch goes on; the next job's end drains again)
                        LOG.exception("starting queued jobs after the engine of %s came back", server)

    def _sweep(self, server: str) -> bool:
        """Remove what is left on `server` of jobs that are over, and of GPUs a job that goes on lost there;
        whether that was done."""
        keep = {j.id for j in self.jobs.values() if j.active}
        pairs = {(j.id, g) for j in self.jobs.values() if j.active for g in j.gpus}
        try:
            gone = self.driver.sweep(server, keep, pairs)
        except Exception as e:  # noqa: BLE001 (down again: the next poll retries)
            LOG.error("cannot remove stale containers on %s: %s", server, e)
            return False
        if gone:
            LOG.warning("removed stale containers of GPUs %s on %s", ", ".join(gone), server)
        return True

"""After a restart, and when a server's engine comes back: jobs found running are followed again or failed, what is
left of ended jobs is removed.
"""

from __future__ import annotations

from controller.core.jobs import ACTIVE, Job
from controller.jobs.steps import LOG


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
            elif job.state in ACTIVE:
                self._fail(job, f"the controller restarted while the job was {job.state}", None)
        for server in self.ctx.rack.servers:
            self._sweep(server)

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
                was_down = server in self.driver.down_servers()
                if self.driver.engines.ping(server) and was_down:
                    self._sweep(server)
                    try:
                        self._drain_queue()  # its GPUs can take queued jobs again
                    except Exception:  # noqa: BLE001 (the watch goes on; the next job's end drains again)
                        LOG.exception("starting queued jobs after the engine of %s came back", server)

    def _sweep(self, server: str) -> None:
        keep = {j.id for j in self.jobs.values() if j.active}
        try:
            gone = self.driver.sweep(server, keep)
        except Exception as e:  # noqa: BLE001 (down again: the next poll retries)
            LOG.error("cannot remove stale containers on %s: %s", server, e)
            return
        if gone:
            LOG.warning("removed stale containers of GPUs %s on %s", ", ".join(gone), server)

"""The controller's side of fail-over for Slurm jobs, until the job service's loop tells its scheduler port itself: the
Slurm app (controller/apps/slurm_api.py) runs `step` every POLL_S and `reconcile` once at start.

- `step`: the servers under the Slurm jobs the controller holds are asked whether their engine answers (the same
  ping the job service's watches use); a dead one's node is set DOWN at once through the scheduler port
  (`node_lost`), so Slurm ends the job and requeues it if it asked, and once the engine answers again the node is
  resumed (`node_back`). The job's record is left to the epilog (Slurm ends the job; the epilog releases it).
- `reconcile`: the Slurm jobs a restarted controller still holds are checked against squeue/sacct (`ended`) and
  those that ended while it was down are released, with the state Slurm gives; then the nodes of servers that
  answer, left down by a controller before this one, are resumed (`resume_answering`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controller.core.jobs import Job
from controller.slurm.scheduler import SchedulerError, SlurmScheduler

LOG = logging.getLogger("optirack.slurm")
POLL_S = 0.5  # seconds between two looks at the servers under Slurm jobs (the job service's watch of servers: 0.5 s)


class SlurmWatch:
    def __init__(self, rack, scheduler: SlurmScheduler, jobs, ping: Callable[[str], str | None]):
        """`jobs`: the job service's facade (its `jobs` and `end_external`); `ping(server)`: None if the server's
        engine answers, else why not."""
        self.rack, self.scheduler, self.jobs, self.ping = rack, scheduler, jobs, ping
        self.lost: dict[str, str] = {}  # server -> the Slurm job under which its node was set down

    def held(self) -> dict[str, Job]:
        """Slurm job id -> the controller's job, for the Slurm jobs it holds GPUs for."""
        out = {}
        for job in list(self.jobs.jobs.values()):
            ext = job.request.get("external") or {}
            if ext.get("scheduler") == self.scheduler.name and job.active:
                out[str(ext["job"])] = job
        return out

    def step(self) -> None:
        for sid, job in self.held().items():
            if job.state != "running":
                continue
            for server in sorted({self.rack.server_of[g] for g in job.gpus}):
                if server in self.lost:
                    continue
                why = self.ping(server)
                if why is None:
                    continue
                self.scheduler.node_lost(sid, server, f"the Docker Engine of server {server} does not answer: {why}")
                self.lost[server] = sid
                LOG.warning("server %s under Slurm job %s is dead (%s): its node is set DOWN in Slurm", server, sid,
                            why)
        for server in list(self.lost):
            if self.ping(server) is None:
                self.scheduler.node_back(server)
                LOG.info("server %s answers again: its node is resumed in Slurm if it is still down for us", server)
                del self.lost[server]

    def reconcile(self) -> dict[str, str]:
        """Release the held Slurm jobs that ended meanwhile; returns them with their state. Raises SchedulerError
        when Slurm cannot be asked (then nothing changed)."""
        held = self.held()
        ended = self.scheduler.ended(sorted(held))
        for sid, state in ended.items():
            self.jobs.end_external(self.scheduler.name, sid, state)
            LOG.warning("Slurm job %s ended while the controller was away (%s): its GPUs and circuits are released",
                        sid, state)
        return ended


    def resume_answering(self) -> list[str]:
        """At start: the servers that answer, whose node a controller before this one set down, are resumed (node_back
        leaves every other node as it is). Returns the servers asked about."""
        asked = []
        for server in self.rack.servers:
            if self.ping(server) is None:
                self.scheduler.node_back(server)
                asked.append(server)
        return asked


def run(watch: SlurmWatch, sleep: Callable[[float], None], retry_s: float = 10.0) -> None:
    """The app's thread: reconcile and resume (again every `retry_s` while Slurm does not answer), then `step` for
    ever."""
    while True:
        try:
            watch.reconcile()
            watch.resume_answering()
            break
        except SchedulerError as e:
            LOG.error("cannot reconcile the Slurm jobs held with Slurm's (trying again in %g s): %s", retry_s, e)
            sleep(retry_s)
    while True:
        sleep(POLL_S)
        try:
            watch.step()
        except Exception:  # noqa: BLE001 (the watch goes on; a node not marked now is marked at the next look)
            LOG.exception("watching the servers under Slurm jobs")

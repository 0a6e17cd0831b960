"""Submitting a job: admitted at once or queued (first in, first out), and the queue drained as GPUs free up."""

from __future__ import annotations

from controller.core import admission
from controller.core import placement as policy
from controller.core.circuits import CircuitMap
from controller.core.jobs import QUEUED, Job, JobRequest, transition
from controller.core.occupancy import Occupancy
from controller.jobs.errors import Conflict
from controller.jobs.steps import LOG


class QueueMixin:
    # --- submitting, the queue, and placing --------------------------------------------
    def occ(self, circuits: CircuitMap | None = None, exclude: str | None = None, admitting: bool = False) -> Occupancy:
        """The occupancy brought up to date with `circuits` (default: now) and the active jobs' GPUs;
        `admitting`: the GPUs of servers whose Docker Engine is down count as held too (a new job avoids them)."""
        holders = {g: j for g, j in self.busy_gpus().items() if j != exclude}
        if admitting:
            down = self.down_servers()
            holders.update(
                {
                    g: f"the engine of {s} (down)"
                    for g, s in self.ctx.rack.server_of.items()
                    if s in down and g not in holders
                }
            )
        self.occupancy.sync(self.ctx.circuits if circuits is None else circuits, holders)
        return self.occupancy

    @staticmethod
    def _request(job: Job, named: bool = False) -> policy.Request:
        r = job.request
        gpus = job.gpus if named else r["gpus"]
        return policy.Request(
            gpus if isinstance(gpus, int) else tuple(gpus),
            r["policy"],
            r.get("gpu_model"),
            r["workload"].get("model", "vgg16"),
        )

    def submit(self, req: JobRequest) -> Job:
        """Admit a job: placed at once (its GPUs reserved, started in the background), or queued.

        Raises policy.InvalidRequest (bad input), policy.NoRoomNow (cannot be placed now and
        `queue` is false) or policy.PlacementError (this rack can never place it); nothing changes then.
        """
        job = Job(id="", request=req.model_dump(), created_at=self.ctx.clock())
        if isinstance(req.gpus, list) and set(req.gpus) <= set(self.ctx.rack.gpus):
            self._refuse_down_engines(req.gpus)  # 409 naming the server, not a wait in the queue
        with self._admit:
            try:
                p = policy.plan(self.occ(admitting=True), self._request(job))
            except policy.NoRoomNow as e:
                p, wait = None, str(e)
            if p is not None and self.queue:
                p, wait = None, f"{len(self.queue)} queued job(s) ahead (first in, first out)"
            elif p is not None and self._awaiting:
                p, wait = None, f"{len(self._awaiting)} recovering job(s) waiting for spares ahead of it"
            if p is None and not req.queue:
                raise policy.NoRoomNow(f"{wait}; not queued (queue: false)")
            job.id = f"job-{next(self._ids)}"
            self.jobs[job.id] = job
            if p is None:
                transition(job, QUEUED, note=f"waiting: {wait}")
                self.queue.append(job.id)
                self._number_queue()
                self.save(job)
                LOG.info("%s queued at position %d: %s", job.id, job.position, wait)
            else:
                self._admit_job(job, p)
        return job

    def _admit_job(self, job: Job, p: policy.Plan) -> None:
        transition(job, "pending", gpus=list(p.gpus), switches=list(p.switches), note=p.note)
        self.save()
        LOG.info(
            "%s admitted: %d GPUs %s, policy %s; %s",
            job.id,
            len(p.gpus),
            ",".join(p.gpus),
            job.request["policy"],
            p.note,
        )
        self.rt.spawn(self._run, job, p)

    def _number_queue(self) -> None:
        for i, job_id in enumerate(self.queue):
            self.jobs[job_id].position = i + 1

    def _drain_queue(self) -> None:
        """Start queued jobs, in order of arrival, while the first one can be placed."""
        def attempt(job_id: str) -> admission.Outcome:
            job = self.jobs[job_id]
            try:
                p = policy.plan(self.occ(admitting=True), self._request(job))
            except policy.NoRoomNow as e:
                job.note = f"waiting: {e}"
                return admission.Outcome.WAIT
            except policy.PlacementError as e:  # the rack changed under it: it can never run
                transition(job, "failed", reason=str(e), ended_at=self.ctx.clock(), position=None)
                self.save(job)
                return admission.Outcome.REFUSED
            job.position = None
            self._admit_job(job, p)
            return admission.Outcome.PLACED

        if self._awaiting:
            return  # a recovering job waiting for spares comes first: it takes them when it tries again
        with self._admit:
            admission.fifo(self.queue, attempt)
            self._number_queue()
            self.save()

    def _drain_when_ready(self, timeout: float = 60.0) -> None:
        """After a restart: start queued jobs once every OCS is back in sync (or after `timeout` s)."""
        self._wait_for_devices(timeout)
        self._drain_queue()

    def _wait_for_devices(self, timeout: float) -> bool:
        """Wait until every OCS is connected and holds our circuits (at most `timeout` s); whether they are."""
        waited = 0.0
        while self.ctx.ocs and set(self.ctx.ocs.synchronised) != set(self.ctx.rack.ocs):
            if waited >= timeout:
                return False
            self.rt.sleep(0.2)
            waited += 0.2
        return True

    def _refuse_down_engines(self, gpus: list[str]) -> None:
        """409 naming the server, for GPUs whose server's engine does not answer now."""
        servers = sorted({self.ctx.rack.server_of[g] for g in gpus})
        down = {s: self.down_servers()[s] for s in servers if not self.driver.engines.ping(s)}
        if down:
            raise Conflict(
                "gpus: "
                + "; ".join(
                    f"the Docker Engine of server {s} is down ({why}): "
                    f"{', '.join(g for g in gpus if self.ctx.rack.server_of[g] == s)} cannot run"
                    for s, why in down.items()
                )
            )

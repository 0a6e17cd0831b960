"""Jobs a scheduler outside placed (Slurm, through its PrologSlurmctld; controller/slurm/): the GPUs it allocated get
circuits and flows, regrouped under one switch in one circuit change, and are held while the job runs; no container is
started (the scheduler runs the ranks), and the job is ended from outside, which releases its GPUs and circuits.

Such a job is marked in its request (`request["external"]`: the scheduler, its job id there, the user), so that the
parts that follow containers (recovery after a restart, failover's watches) pass it over. It is in the job book like
any other job, so GET /jobs, `optirack jobs` and the live page show it.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.core import placement as policy
from controller.core.circuits import CircuitMap
from controller.core.jobs import Job, JobRequest, transition
from controller.jobs.errors import Conflict
from controller.jobs.steps import LOG, RECONFIG_WAIT, _reason, displaced_note

FINAL = {"COMPLETED": "done", "CANCELLED": "stopped"}  # any other end (FAILED, TIMEOUT, NODE_FAIL, ...): failed


def is_external(job: Job) -> bool:
    return bool(job.request.get("external"))


def external_id(scheduler: str, job: str) -> str:
    return f"{scheduler}-{job}"


class External:
    def __init__(self, book, state, changes, lifecycle, drain: Callable[[], None]):
        self.book, self.state, self.changes, self.lifecycle = book, state, changes, lifecycle
        self.drain = drain  # start queued jobs (queue.Queue.drain)

    def begin(self, scheduler: str, job_id: str, user: str, gpus: list[str], hold: bool = False,
              policy_name: str = "regroup") -> Job:
        """Place `gpus` (policy regroup: under one switch if any can take them all, circuits and flows confirmed in one
        change; fixed: where they are) and hold them. No switch can take them all: placed spread (the note says so),
        or with `hold` Conflict and nothing changes. Raises policy.InvalidRequest (GPUs not of this rack), Conflict (a
        GPU is held, or the job is already placed)."""
        jid = external_id(scheduler, job_id)
        if jid in self.book.jobs and self.book.jobs[jid].active:
            raise Conflict(f"{scheduler} job {job_id} is already placed ({jid})")
        request = JobRequest(name=f"{scheduler} {job_id}", gpus=gpus, policy=policy_name, queue=False).model_dump()
        request["external"] = {"scheduler": scheduler, "job": job_id, "user": user}
        job = Job(id=jid, request=request, created_at=self.state.clock())
        req = policy.Request(tuple(gpus), policy_name, None, "vgg16")
        decided: dict = {}

        def plan(current: CircuitMap) -> CircuitMap | None:
            try:
                p = policy.plan(self.book.occ(current, exclude=jid), req)
            except policy.NoRoomNow as e:  # a GPU held (by a job of ours, or one the scheduler did not end with us)
                raise Conflict(f"cannot place {scheduler} job {job_id}: {e}") from None
            if len(p.switches) > 1 and policy_name == "regroup" and hold:
                raise Conflict(f"cannot regroup {scheduler} job {job_id}'s GPUs under one switch now: {p.note}")
            decided.update(plan=p)
            if "job" not in decided:  # held from here on: under the reconfiguration lock, before the change
                if jid in self.book.jobs:  # a requeued job comes back under its id: its old record goes
                    self.book.forget([jid])
                self.book.jobs[jid] = job
                transition(job, "pending", gpus=list(p.gpus), switches=list(p.switches))
                transition(job, "configuring")
                decided["job"] = job
            return p.target(current) if p.changes else None

        try:
            with self.lifecycle.lock:
                ev = self.changes.change(plan, "job", lambda: f"{jid}: place {len(gpus)} GPUs ({policy_name})",
                                         job=jid, wait=RECONFIG_WAIT,
                                         note=lambda: displaced_note(self.state.rack, decided["plan"].diff, gpus))
        except Exception as e:  # noqa: BLE001 (the edge: a job registered fails with the reason; else nothing changed)
            if "job" not in decided:
                raise
            self.lifecycle.fail(job, _reason(e), None, e)
            raise Conflict(f"{scheduler} job {job_id} could not be placed: {job.reason}") from None
        p = decided["plan"]
        job.gpus, job.switches = list(p.gpus), list(p.switches)
        if ev is not None:
            job.events.append(ev.id)
        job.circuits = self.book.circuits_of(job)
        transition(job, "running", started_at=self.state.clock())
        job.note = self._note(job, p, ev)
        self.book.save()
        LOG.info("%s (%s job %s of %s) running on %s: %s", jid, scheduler, job_id, user, ",".join(job.gpus), job.note)
        return job

    @staticmethod
    def _note(job: Job, p: policy.Plan, ev) -> str:
        where, gpus = ", ".join(job.switches), ", ".join(job.gpus)
        if job.request["policy"] == "fixed":
            return f"{gpus} kept where they are (fixed), under {where}"
        if len(job.switches) > 1:
            return f"runs fragmented over {where}: no switch has a free downlink for every GPU ({p.note})"
        if ev is None:
            return f"{gpus} under {where} already (no circuit change)"
        return f"{gpus} under {where} ({p.note})"

    def end(self, scheduler: str, job_id: str, state: str) -> Job:
        """The job ended outside (`state` as the scheduler says it): its GPUs and circuits are released. Raises
        UnknownJob if it was never placed; an ended job is answered as it is."""
        job = self.book.get(external_id(scheduler, job_id))
        if not job.active:
            return job
        word = state.split()[0].upper() if state.strip() else "COMPLETED"
        final = FINAL.get(word, "failed")
        job.request["external"]["state"] = state or "COMPLETED"
        if job.state != "running":  # ended while it was being placed (or found so after a restart)
            self.lifecycle.fail(job, f"{scheduler}: {state} while it was {job.state}", None)
            return job
        self.lifecycle.finish(job, final, None if final == "done" else f"{scheduler}: {state}")
        LOG.info("%s (%s job %s) ended: %s; its GPUs and circuits are released", job.id, scheduler, job_id, state)
        return job

"""Jobs Slurm scheduled: the GPUs Slurm gave a job regrouped under one switch when it starts, held
while it runs, and released when it ends. optirack starts no container for them (Slurm runs the
ranks); the job is in the controller's job table like any other, so GET /jobs, `optirack jobs`
and the live page show it, with the Slurm job id and user in its request (`request.slurm`).

It stands beside the job service and asks it only for what any placement needs: the admission
locks, the occupancy, `_place` (plan and apply the circuits and flows, confirmed, in one circuit
change), and `_fail`/`_end` (undo and record the end). Nothing of the job service is changed.
"""
from __future__ import annotations

from controller.core import placement as policy
from controller.core.jobs import Job, JobRequest, transition
from controller.jobs.errors import Conflict
from controller.jobs.steps import LOG, _reason

PREFIX = "slurm-"
FINAL = {"COMPLETED": "done", "CANCELLED": "stopped"}  # any other Slurm end (FAILED, TIMEOUT, NODE_FAIL, ...): failed


def job_id(slurm_job: str) -> str:
    return PREFIX + slurm_job


class SlurmJobs:
    def __init__(self, service):
        self.svc = service  # controller.jobs.service.JobService

    def begin(self, slurm_job: str, user: str, gpus: list[str], hold: bool, policy_name: str = "regroup") -> Job:
        """Regroup `gpus` under one switch (circuits and flows, confirmed) and hold them for the job
        (policy `fixed`: hold them where they are, as the paper's job beside does).
        No switch can take them all: placed as they are (fragmented) and the note says so, or, with
        `hold`, Conflict and nothing changes. Raises policy.InvalidRequest for GPUs not of this rack,
        Conflict if one is held or the Slurm job is already placed."""
        svc = self.svc
        jid = job_id(slurm_job)
        if jid in svc.jobs and svc.jobs[jid].active:
            raise Conflict(f"Slurm job {slurm_job} is already placed ({jid})")
        request = JobRequest(name=f"slurm {slurm_job}", gpus=gpus, policy=policy_name, queue=False).model_dump()
        request["slurm"] = {"job": slurm_job, "user": user}
        job = Job(id=jid, request=request, created_at=svc.ctx.clock())
        fragmented = ""
        with svc._admit:
            try:
                p = policy.plan(svc.occ(), svc._request(job))
            except policy.NoRoomNow as e:  # a GPU held (by a job of ours, or one Slurm did not end with us)
                raise Conflict(f"cannot place Slurm job {slurm_job}: {e}") from None
            if len(p.switches) > 1 and policy_name == "regroup":  # it spreads what no single switch can take
                if hold:
                    raise Conflict(f"cannot regroup Slurm job {slurm_job}'s GPUs under one switch now: {p.note}")
                fragmented = p.note
            if jid in svc.jobs:  # a requeued Slurm job comes back under its id: its old record goes
                svc.ctx.store.delete_jobs([jid])
                del svc.jobs[jid]
            svc.jobs[jid] = job
            transition(job, "pending", gpus=list(p.gpus), switches=list(p.switches), note=p.note)
        placed: dict = {}
        try:
            with svc.admission:
                transition(job, "configuring")
                svc.save()
                svc._place(job, placed, p)
                job.circuits = svc._circuits_of(job)
                transition(job, "running", started_at=svc.ctx.clock())
                svc.save()
        except Exception as e:  # noqa: BLE001 (the edge: the job fails with the reason, its change undone)
            svc._fail(job, _reason(e), placed.get("diff"), e)
            raise Conflict(f"Slurm job {slurm_job} could not be placed: {job.reason}") from None
        where = ", ".join(job.switches)
        if policy_name == "fixed":
            job.note = f"{', '.join(job.gpus)} kept where they are (fixed), under {where}"
        elif fragmented:
            job.note = f"runs fragmented over {where}: no switch has a free downlink for every GPU ({fragmented})"
        elif job.switches and not job.events:
            job.note = f"{', '.join(job.gpus)} under {where} already (no circuit change)"
        else:
            job.note = f"{', '.join(job.gpus)} under {where}" + (f" ({job.note})" if job.note else "")
        svc.save()
        LOG.info("%s (Slurm job %s of %s) running on %s: %s", jid, slurm_job, user, ",".join(job.gpus), job.note)
        return job

    def end(self, slurm_job: str, state: str) -> Job:
        """The Slurm job ended (`state` as Slurm says it): its GPUs and circuits are released. Raises
        UnknownJob if it was never placed; an ended job is answered as it is."""
        job = self.svc.get(job_id(slurm_job))
        if not job.active:
            return job
        word = state.split()[0].upper() if state.strip() else "COMPLETED"
        final = FINAL.get(word, "failed")
        job.request["slurm"]["state"] = state or "COMPLETED"
        self.svc._end(job, final, None if final == "done" else f"Slurm: {state}")
        LOG.info("%s (Slurm job %s) ended: %s; its GPUs and circuits are released", job.id, slurm_job, state)
        return job

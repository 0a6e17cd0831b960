"""Jobs a scheduler outside placed (Slurm, through its PrologSlurmctld; controller/slurm/): the GPUs it allocated get
circuits and flows, regrouped under one switch in one circuit change, and are held while the job runs; no container is
started (the scheduler runs the ranks), and the job is ended from outside, which releases its GPUs and circuits.

An external job is a kind of job (`Job.kind`, from its request: `request["external"]`, the scheduler, its job id
there, the user): the loop reconciles jobs by kind and state, and none of the steps that follow containers is handed
one (service.py). Its server's death is told
to its scheduler (detect.py, through the SchedulerPort), which ends or requeues it. It is in the job book like any
other job, so GET /jobs, `optirack jobs` and the live page show it. Steps of the loop: `begin` decides and registers
the job, the circuit change is an action, `placed` answers the scheduler's prolog; `end` releases it.
"""

from __future__ import annotations

from controller.core import placement as policy
from controller.core.circuits import CircuitMap
from controller.core.errors import Conflict
from controller.core.jobs import Job, JobRequest, transition
from controller.jobs.actions import Actions
from controller.jobs.book import JobBook
from controller.jobs.inbox import Done, End, Inbox, Reply
from controller.jobs.ports import CircuitChangesPort
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG, RECONFIG_WAIT, _reason, displaced_note

FINAL = {"COMPLETED": "done", "CANCELLED": "stopped"}  # any other end (FAILED, TIMEOUT, NODE_FAIL, ...): failed


def external_id(scheduler: str, job: str) -> str:
    return f"{scheduler}-{job}"


class External:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, changes: CircuitChangesPort):
        self.book, self.inbox, self.changes = book, inbox, changes
        self.actions = Actions(book, inbox, rt)

    def begin(self, reply: Reply, scheduler: str, job_id: str, user: str, gpus: list[str], hold: bool = False,
              policy_name: str = "regroup") -> None:
        """Place `gpus` (policy regroup: under one switch if any can take them all, circuits and flows confirmed in one
        change; fixed: where they are) and hold them; answers the running Job. No switch can take them all: placed
        spread (the note says so), or with `hold` Conflict and nothing changes. Raises policy.InvalidRequest (GPUs
        not of this rack), Conflict (a GPU is held, or the job is already placed)."""
        jid = external_id(scheduler, job_id)
        if jid in self.book.jobs and self.book.jobs[jid].active:
            raise Conflict(f"{scheduler} job {job_id} is already placed ({jid})")
        request = JobRequest.model_validate({"name": f"{scheduler} {job_id}", "gpus": gpus, "policy": policy_name,
                                             "queue": False}).model_dump()
        request["external"] = {"scheduler": scheduler, "job": job_id, "user": user}
        req = policy.Request(tuple(gpus), policy_name, None, "vgg16")
        try:
            p = policy.plan(self.book.occ(exclude=jid), req)
        except policy.NoRoomNow as e:  # a GPU held (by a job of ours, or one the scheduler did not end with us)
            raise Conflict(f"cannot place {scheduler} job {job_id}: {e}") from None
        if len(p.switches) > 1 and policy_name == "regroup" and hold:
            raise Conflict(f"cannot regroup {scheduler} job {job_id}'s GPUs under one switch now: {p.note}")
        if jid in self.book.jobs:  # a requeued job comes back under its id: its old record goes
            self.book.forget([jid])
        job = self.book.jobs[jid] = Job(id=jid, request=request, created_at=self.book.clock())
        transition(job, "pending", gpus=list(p.gpus), switches=list(p.switches))
        transition(job, "configuring")
        self.book.save()
        self.actions.start(jid, "external.placed", self._place, job, req, reply)

    def _place(self, job: Job, req: policy.Request, reply: Reply) -> tuple:
        decided: dict = {}

        def plan(current: CircuitMap) -> CircuitMap | None:
            p = policy.plan(self.book.occ(current, exclude=job.id), req)
            decided.update(plan=p)
            return p.target(current) if p.changes else None

        try:
            ev = self.changes.change(plan, "job", f"{job.id}: place {len(job.gpus)} GPUs ({req.policy})", job=job.id,
                                     wait=RECONFIG_WAIT,
                                     note=lambda: displaced_note(self.book.rack, decided["plan"].diff, job.gpus))
        except Exception as e:  # noqa: BLE001 (the job fails with the reason, and the scheduler is refused)
            return reply, None, None, e
        return reply, decided["plan"], ev, None

    def placed(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        reply, p, ev, error = done.result
        if error is not None:
            self.inbox.post(End(job.id, "failed", _reason(error)))
            ext = job.request["external"]
            reply.fail(Conflict(f"{ext['scheduler']} job {ext['job']} could not be placed: {_reason(error)}"))
            return
        job.gpus, job.switches = list(p.gpus), list(p.switches)
        if ev is not None:
            job.events.append(ev.id)
        job.circuits = self.book.circuits_of(job)
        transition(job, "running", started_at=self.book.clock())
        job.note = self._note(job, p, ev)
        self.book.save()
        ext = job.request["external"]
        LOG.info("%s (%s job %s of %s) running on %s: %s", job.id, ext["scheduler"], ext["job"], ext["user"],
                 ",".join(job.gpus), job.note)
        reply.set(job)

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

    def end(self, reply: Reply, scheduler: str, job_id: str, state: str) -> None:
        """The job ended outside (`state` as the scheduler says it): its GPUs and circuits are released (answered once
        they are). Raises UnknownJob if it was never placed; an ended job is answered as it is."""
        job = self.book.get(external_id(scheduler, job_id))
        if not job.active:
            reply.set(job)
            return
        word = state.split()[0].upper() if state.strip() else "COMPLETED"
        final = FINAL.get(word, "failed")
        job.request["external"]["state"] = state or "COMPLETED"
        if job.state != "running":  # ended while it was being placed (or found so after a restart)
            self.book.inflight.pop(job.id, None)
            self.inbox.post(End(job.id, "failed", f"{scheduler}: {state} while it was {job.state}", reply=reply))
            return
        LOG.info("%s (%s job %s) ended: %s; its GPUs and circuits are released", job.id, scheduler, job_id, state)
        self.inbox.post(End(job.id, final, None if final == "done" else f"{scheduler}: {state}", reply=reply))

"""The controller beside Slurm. REST for jobs Slurm scheduled (controller/jobs/external.py): the PrologSlurmctld asks
for the GPUs Slurm allocated to be regrouped, the EpilogSlurmctld says the job ended; GET /jobs lists them. The Slurm
app keeps topology.conf to the live circuits (controller/slurm/topology.py): one thread looks at the circuits'
version every POLL_S and refreshes the tree when it moved, whatever changed them (a job, a fail-over, a
defragmentation, REST); GET /slurm/topology shows what it did. Fail-over is the job service's: its loop tells Slurm
of a dead server under a Slurm job, and of its return, and reconciles the Slurm jobs a restarted controller holds
(the scheduler port the wiring gave it, ctx.scheduler: controller/slurm/scheduler.py); at start, this app resumes the
nodes a controller before this one left down whose servers answer again."""
from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from ryu.app.wsgi import route
from ryu.base import app_manager

from controller.apps.context import Optirack
from controller.apps.http import PREFIX, OptirackController, RequestRefused, api, json_response, path_text, read_json
from controller.config import conf
from controller.core.placement import InvalidRequest
from controller.drivers.engines import PING_TIMEOUT
from controller.jobs.errors import UnknownJob
from controller.slurm.allocation import AllocationError, gpus_of
from controller.slurm.scheduler import SchedulerError, SlurmScheduler
from controller.slurm.topology import TopologyKeeper

LOG = logging.getLogger("optirack.slurm")
POLL_S = 0.2  # seconds between two looks at the circuits' version (a refresh follows a change within this)
EPILOG_WAIT_S = 2.0  # how long a prolog waits for the end of the Slurm job that held its GPUs before asking Slurm
RECONFIGURE_RETRY_S = 5.0  # seconds before a refused or unanswered `scontrol reconfigure` is tried again
RESUME_RETRY_S = 10.0  # seconds between two tries to resume the nodes left down, while Slurm does not answer

SLURM_JOB = {"slurm_job": r"[^/]+"}
SLURM_ID = r"^[0-9]+([_+][0-9]+)?$"  # 12, an array task 12_3, a heterogeneous component 12+1


class SlurmJobBody(BaseModel):
    """The body of POST /slurm/jobs."""

    model_config = ConfigDict(extra="forbid", strict=True)
    slurm_job: str = Field(..., pattern=SLURM_ID, max_length=32)
    user: str = Field("", max_length=64)
    gpus: list[str] | None = Field(None, min_length=1, max_length=4096, description="the rack's GPU names; or nodes")
    nodes: dict[str, list[int]] | None = Field(None, min_length=1, max_length=4096,
                                               description="Slurm's nodes and each one's GRES indexes of the job (what "
                                               "scontrol show job -d prints as IDX), named into GPUs here; or gpus")
    hold: bool = Field(False, description="no switch can take every GPU: 409 instead of running fragmented")
    policy: Literal["regroup", "fixed"] = Field("regroup", description="fixed: hold the GPUs where they are")


class SlurmEndBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    state: str = Field("", max_length=64, description="Slurm's JobState at the end, e.g. COMPLETED, CANCELLED")


class SlurmApi(OptirackController):

    @property
    def jobs(self):
        if self.ctx.jobs is None:
            raise RequestRefused(503, "the placement app is not loaded (controller.apps.placement)")
        return self.ctx.jobs

    @route("slurm_jobs", PREFIX + "/slurm/jobs", methods=["POST"])
    @api(mutation=True)
    def begin(self, req, **_):
        body = read_json(req, SlurmJobBody)
        if (body.gpus is None) == (body.nodes is None):
            raise RequestRefused(400, "give the job's gpus or its nodes, one of them", "gpus")
        try:
            gpus = body.gpus if body.gpus is not None else gpus_of(self.ctx.rack, body.nodes or {})
        except AllocationError as e:
            raise RequestRefused(400, str(e), "nodes") from None
        if len(set(gpus)) != len(gpus):
            raise RequestRefused(400, "a GPU is named twice", "gpus" if body.gpus is not None else "nodes")
        self._release_ended(body.slurm_job, gpus)
        try:
            job = self.jobs.begin_external("slurm", body.slurm_job, body.user, gpus, body.hold, body.policy)
        except InvalidRequest as e:
            raise RequestRefused(400, str(e), "gpus") from None
        resp = json_response({"job": job.to_json(), "note": job.note}, 201)
        resp.headers["Location"] = f"{PREFIX}/jobs/{job.id}"
        return resp

    def _release_ended(self, slurm_job: str, gpus: list[str]) -> None:
        """Slurm gives a GPU to one job at a time: one still held for another Slurm job means that job's end has not
        reached the controller yet: slurmctld hands the GPUs on while the last job's EpilogSlurmctld still runs, or
        the epilog never got through. Its end is waited for up to EPILOG_WAIT_S (the epilog's call releasing it may
        be under way); then Slurm is asked (squeue, sacct) and those it says ended are released, with the state it
        gives; one it says still runs stays held (the new job is then refused or runs fragmented)."""
        def held() -> dict[str, str]:
            busy = self.jobs.busy_gpus()
            others = {busy[g] for g in gpus if g in busy} - {f"slurm-{slurm_job}"}
            jobs = {j: self.jobs.jobs.get(j) for j in others}
            return {j: job.request["external"]["job"] for j, job in jobs.items()
                    if job is not None and (job.request.get("external") or {}).get("scheduler") == "slurm"}

        waited = 0.0
        while held() and waited < EPILOG_WAIT_S:
            self.ctx.rt.sleep(0.05)
            waited += 0.05
        left = held()
        scheduler = getattr(self.ctx, "scheduler", None)
        if scheduler is None or not left:
            return
        try:
            ended = scheduler.ended(sorted(left.values()))
        except SchedulerError as e:
            LOG.warning("Slurm job %s: cannot ask Slurm whether %s ended: %s", slurm_job, ", ".join(left), e)
            return
        for sid, state in ended.items():
            if self.jobs.jobs[f"slurm-{sid}"].active:  # (its epilog may have come meanwhile)
                self.jobs.end_external("slurm", sid, state)
                LOG.warning("slurm-%s ended (%s, as Slurm says) and its epilog did not come: its GPUs go to Slurm job "
                            "%s", sid, state, slurm_job)

    @route("slurm_job_end", PREFIX + "/slurm/jobs/{slurm_job}/end", methods=["POST"], requirements=SLURM_JOB)
    @api(mutation=True)
    def end(self, req, slurm_job, **_):
        body = read_json(req, SlurmEndBody) if req.body.strip() else SlurmEndBody()
        try:
            job = self.jobs.end_external("slurm", slurm_job, body.state)
        except UnknownJob:
            raise RequestRefused(404, f"no job of Slurm job {path_text(slurm_job)!r}", "slurm_job") from None
        return json_response({"job": job.to_json()})

    @route("slurm_topology", PREFIX + "/slurm/topology", methods=["GET"])
    @api()
    def topology(self, req, **_):
        keeper = getattr(self.ctx, "slurm_topology", None)
        if keeper is None:
            return json_response({"slurm_conf": None, "topology": None, "kept": False, "refreshes": 0, "unchanged": 0,
                                  "reconfigures": 0, "failed": 0, "in_flight": 0, "most_in_flight": 0,
                                  "stale": False, "history": []})
        return json_response(keeper.status())


def keep_topology(ctx, keeper: TopologyKeeper) -> None:
    """The keeper's thread: a refresh whenever the circuits' version or slurm.conf moved since the last one (one at a
    time: changes during a refresh are seen, together, by the next)."""
    seen, retry_at = None, None
    while True:
        key = (ctx.circuits_version, keeper.key())
        if key != seen or (retry_at is not None and keeper.clock() >= retry_at):
            seen, retry_at = key, None
            try:
                done = keeper.refresh()
                if done in ("reconfigured", "failed"):
                    last = keeper.history[-1]
                    LOG.info("topology.conf rewritten, scontrol reconfigure %s in %.2f s%s", done, last["seconds"],
                             f": {last['error']}" if last["error"] else "")
                if done == "failed":  # slurmctld may hold the tree before: reload again, change or not
                    retry_at = keeper.clock() + RECONFIGURE_RETRY_S
            except Exception:  # noqa: BLE001 (the keeper goes on at the next change)
                LOG.exception("keeping %s", keeper.path)
        ctx.rt.sleep(POLL_S)


def resume_left_down(scheduler: SlurmScheduler, answers, sleep, retry_s: float = RESUME_RETRY_S) -> None:
    """The app's thread at start: the nodes a controller before this one set down, whose servers answer again, are
    resumed (again every `retry_s` while Slurm does not answer). A server that dies later is the job service's."""
    while True:
        try:
            scheduler.resume_answering(answers)
            return
        except SchedulerError as e:
            LOG.error("cannot resume the nodes left down (trying again in %g s): %s", retry_s, e)
            sleep(retry_s)


class SlurmApp(app_manager.RyuApp):
    """Beside the Slurm whose slurm.conf the controller is given (--optirack-slurm-conf): keeps topology.conf to the
    live circuits and, at start, resumes the nodes left down by a controller before this one (controller/slurm/)."""

    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        path = conf().slurm_conf
        self.keeper = None if not path or path == "none" else TopologyKeeper(self.ctx.rack, path,
                                                                                lambda: self.ctx.circuits)
        self.ctx.slurm_topology = self.keeper
        self.own: list = []  # the app's own threads (ended with the process)

    def start(self):
        thread = super().start()
        if self.keeper is not None:
            # not in self.threads: Ryu's stop joins those (its event loop's), and this one never ends by itself
            self.own.append(self.ctx.rt.spawn(keep_topology, self.ctx, self.keeper))
        scheduler = self.ctx.scheduler
        if isinstance(scheduler, SlurmScheduler) and self.ctx.jobs is not None:
            engines = self.ctx.jobs.containers.engines
            self.own.append(self.ctx.rt.spawn(resume_left_down, scheduler,
                                              lambda s: engines.answers(s, PING_TIMEOUT), self.ctx.rt.sleep))
        return thread

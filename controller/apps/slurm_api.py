"""REST for jobs Slurm scheduled (controller/jobs/external.py): the PrologSlurmctld asks for the GPUs
Slurm allocated to be regrouped, the EpilogSlurmctld says the job ended. GET /jobs lists them."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from ryu.app.wsgi import route

from controller.apps.http import PREFIX, OptirackController, RequestRefused, api, json_response, path_text, read_json
from controller.core.placement import InvalidRequest
from controller.jobs.errors import UnknownJob

SLURM_JOB = {"slurm_job": r"[^/]+"}
SLURM_ID = r"^[0-9]+([_+][0-9]+)?$"  # 12, an array task 12_3, a heterogeneous component 12+1


class SlurmJobBody(BaseModel):
    """The body of POST /slurm/jobs."""

    model_config = ConfigDict(extra="forbid", strict=True)
    slurm_job: str = Field(..., pattern=SLURM_ID, max_length=32)
    user: str = Field("", max_length=64)
    gpus: list[str] = Field(..., min_length=1, max_length=4096)
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
        if len(set(body.gpus)) != len(body.gpus):
            raise RequestRefused(400, "a GPU is named twice", "gpus")
        try:
            job = self.jobs.begin_external("slurm", body.slurm_job, body.user, body.gpus, body.hold, body.policy)
        except InvalidRequest as e:
            raise RequestRefused(400, str(e), "gpus") from None
        resp = json_response({"job": job.to_json(), "note": job.note}, 201)
        resp.headers["Location"] = f"{PREFIX}/jobs/{job.id}"
        return resp

    @route("slurm_job_end", PREFIX + "/slurm/jobs/{slurm_job}/end", methods=["POST"], requirements=SLURM_JOB)
    @api(mutation=True)
    def end(self, req, slurm_job, **_):
        body = read_json(req, SlurmEndBody) if req.body.strip() else SlurmEndBody()
        try:
            job = self.jobs.end_external("slurm", slurm_job, body.state)
        except UnknownJob:
            raise RequestRefused(404, f"no job of Slurm job {path_text(slurm_job)!r}", "slurm_job") from None
        return json_response({"job": job.to_json()})

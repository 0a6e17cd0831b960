"""REST for jobs: submit (placed or queued), list, inspect, logs, stop, delete, prune, regroup one, defragment all."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from ryu.app.wsgi import route

from controller.apps.http import (
    PREFIX,
    OptirackController,
    RequestRefused,
    api,
    int_param,
    json_response,
    path_text,
    read_json,
)
from controller.core.errors import Conflict
from controller.core.jobs import ACTIVE, QUEUED, TERMINAL, JobRequest
from controller.core.placement import InvalidRequest, PlacementError
from controller.jobs.errors import UnknownJob
from controller.jobs.service import JobService
from controller.jobs.steps import LOG_LINES

JOB_ID = {"job_id": r"[^/]+"}  # any segment: an id that names no job is a JSON 404, not a routing miss


class PruneRequest(BaseModel):
    """The body of POST /jobs/prune: which finished jobs to forget."""

    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types as the OpenAPI document says
    # Absent means "no such limit"; null is not a number (the document says so too).
    older_than_s: float = Field(None, ge=0, description="ended at least this many seconds ago")  # type: ignore[assignment]
    keep: int = Field(None, ge=0, description="always keep the newest this many finished jobs")  # type: ignore[assignment]
    events: bool = Field(False, description="also forget reconfiguration events older than older_than_s")

    @model_validator(mode="after")
    def _something(self):
        if self.older_than_s is None and self.keep is None:
            raise ValueError("give older_than_s, keep, or both")
        if self.events and self.older_than_s is None:
            raise ValueError("events: needs older_than_s")
        return self


class RegroupBody(BaseModel):
    """The optional body of POST /regroup: apply the dry-run plan made from this circuit-map version."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # absent: plan afresh; null is not a version (the document says so): no None in the type, only as the default
    version: int = Field(None, ge=0)  # type: ignore[assignment]


def _bool_param(req, name: str) -> bool:
    text = req.GET.get(name, "false").lower()
    if text not in ("true", "false", "1", "0"):
        raise RequestRefused(400, "expected true or false", name)
    return text in ("true", "1")


class JobsApi(OptirackController):

    @property
    def placement(self) -> JobService:
        return self.ctx.jobs

    def _job(self, job_id: str):
        try:
            return self.placement.get(job_id)
        except UnknownJob:
            raise RequestRefused(404, f"no job {path_text(job_id)!r}", "job_id") from None

    @route("jobs", PREFIX + "/jobs", methods=["POST"])
    @api(mutation=True)
    def submit(self, req, **_):
        body = read_json(req, JobRequest)
        try:
            job = self.placement.submit(body)
        except InvalidRequest as e:  # an unknown model or GPU
            raise RequestRefused(400, str(e), e.field) from None
        except PlacementError as e:  # not now and not queued, or never on this rack
            raise RequestRefused(409, str(e), e.field) from None
        resp = json_response({"job": job.to_json()}, 201)  # placed or queued: the job exists either way
        resp.headers["Location"] = f"{PREFIX}/jobs/{job.id}"
        return resp

    @route("jobs", PREFIX + "/jobs", methods=["GET"])
    @api()
    def list(self, req, **_):
        states = set(filter(None, req.GET.get("state", "").split(",")))
        known = (QUEUED, *ACTIVE, *TERMINAL)
        unknown = states - set(known)
        if unknown:
            raise RequestRefused(400, f"unknown state {', '.join(sorted(unknown))} (states: {', '.join(known)})",
                                 "state")
        before = req.GET.get("before")
        if before is not None and before not in self.placement.jobs:
            raise RequestRefused(404, f"no job {before!r} (it may have been pruned)", "before")
        jobs, older = self.placement.list(int_param(req, "limit", 100, hi=10_000), before, states)
        return json_response({"jobs": [j.to_json() for j in jobs], "older": older,
                              "queue": self.placement.admission.discipline})

    @route("jobs_prune", PREFIX + "/jobs/prune", methods=["POST"])
    @api(mutation=True)
    def prune(self, req, **_):
        body = read_json(req, PruneRequest)
        gone = self.placement.prune(body.older_than_s, body.keep)
        events = self.ctx.store.delete_events(self.ctx.clock() - body.older_than_s) if body.events else 0
        return json_response({"pruned": gone, "events_pruned": events})

    @route("job", PREFIX + "/jobs/{job_id}", methods=["GET"], requirements=JOB_ID)
    @api()
    def show(self, req, job_id, **_):
        job = self._job(job_id)
        body = job.to_json(detail=True)
        history = int_param(req, "history", 0, lo=0)
        if history:
            body["throughput"] = self._throughput(job, history)
        return json_response({"job": body})

    def _throughput(self, job, limit: int) -> dict:
        """Each GPU NIC's throughput while the job ran, seen at its OCS port."""
        end = job.ended_at or self.ctx.clock()
        out = {}
        for gpu in job.gpus:
            ref = self.ctx.rack.gpu_port(gpu)
            dpid = self.ctx.rack.ocs[ref.device].dpid
            samples = [s for s in self.ctx.ports.history(dpid, ref.port)
                       if job.started_at and job.started_at <= s.t <= end + 1.0]
            out[gpu] = [
                {"t": round(s.t, 3), "tx_bps": round(s.rx_bps), "rx_bps": round(s.tx_bps)} for s in samples[-limit:]
            ]
        return out

    @route("job_logs", PREFIX + "/jobs/{job_id}/logs", methods=["GET"], requirements=JOB_ID)
    @api()
    def logs(self, req, job_id, **_):
        job = self._job(job_id)
        lines, source = self.placement.logs(job, int_param(req, "tail", LOG_LINES, lo=1, hi=LOG_LINES))
        return json_response({"job": job.id, "state": job.state, "reason": job.reason, "source": source, "logs": lines})

    @route("job_stop", PREFIX + "/jobs/{job_id}/stop", methods=["POST"], requirements=JOB_ID)
    @api(mutation=True)
    def stop(self, req, job_id, **_):
        """Stop a running job and clean up; its record stays (an ended job is answered as it is)."""
        self._job(job_id)
        return json_response({"job": self.placement.stop(job_id).to_json()})

    @route("job", PREFIX + "/jobs/{job_id}", methods=["DELETE"], requirements=JOB_ID)
    @api(mutation=True)
    def delete(self, req, job_id, **_):
        """Stop the job if it runs, then forget it: the answer is its last record, and GET then says 404."""
        self._job(job_id)
        job = self.placement.delete(job_id)  # 409 while it is still being placed
        return json_response({"job": job.to_json()})

    @route("job_regroup", PREFIX + "/jobs/{job_id}/regroup", methods=["POST"], requirements=JOB_ID)
    @api(mutation=True)
    def regroup(self, req, job_id, **_):
        self._job(job_id)
        try:
            ev, note = self.placement.regroup(job_id)
        except PlacementError as e:
            raise Conflict(str(e)) from None
        job = self.placement.get(job_id)
        return json_response({"job": job.to_json(), "event": ev.to_json() if ev else None, "note": note})

    @route("regroup_all", PREFIX + "/regroup", methods=["POST"])
    @api(mutation=True)
    def regroup_all(self, req, **_):
        dry_run = _bool_param(req, "dry_run")
        version = read_json(req, RegroupBody).version if req.body.strip() else None
        if dry_run and version is not None:  # plan only from that version of the map
            if version != self.ctx.circuits_version:
                raise Conflict(f"the circuit map is at version {self.ctx.circuits_version}, not {version}")
            version = None
        return json_response(self.placement.regroup_all(dry_run=dry_run, version=version))

"""Jobs: what a job asked for, its state, and what its workers reported.

States: [queued ->] pending -> configuring -> running [<-> recovering] -> done | failed (with the reason) | stopped
(POST /jobs/{id}/stop; DELETE also forgets the job). A running job that loses GPUs (a server dies, a worker exits
with an error, a NIC's link drops) goes `recovering`: spares are swapped in and every rank goes on from the last
checkpoint (controller/jobs/recovery.py); `recoveries` records each swap. A job that cannot be placed when it arrives
waits `queued` unless it asked not to (`queue: false`), and starts in the order of the controller's queue discipline
(controller/jobs/admission.py).
A job's record keeps its GPUs in rank order, the switches and circuits it used, its times, and
each rank's per-iteration reports (compute and communication time, GPU utilization).
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from profiles import WORKLOADS

ACTIVE = ("pending", "configuring", "running", "recovering")  # these hold GPUs
QUEUED = "queued"
TERMINAL = ("done", "failed", "stopped")
# Iterations between two checkpoints by default: saving the state of the paper rack's heaviest case (VGG16's
# parameters and momentum, 1.1 GB at 100 Gbit/s, 89 ms) every 20 iterations of its fastest one (one Titan V, 95 ms
# of compute) costs 4.7 % of iteration time; tests/unit/test_failover.py computes it for every case of the rack.
DEFAULT_CHECKPOINT_EVERY = 20
DEFAULT_WARM_SPARES = 1  # an idle warm worker: about 218 MiB of RSS and 0.6 % of a core (docs/jobs.md)
NEW = "new"  # a job being submitted: admitted (pending) or queued before anyone can read it

# Every state change a job may make, and the only place one is allowed: `transition` checks it.
TRANSITIONS: dict[str, frozenset[str]] = {
    NEW: frozenset({QUEUED, "pending"}),
    QUEUED: frozenset({"pending", "failed", "stopped"}),  # failed: the rack changed so it can never run
    "pending": frozenset({"configuring"}),  # a restarted controller places a job it finds pending
    "configuring": frozenset({"running", "failed"}),
    "running": frozenset({"done", "failed", "stopped", "recovering"}),
    # recovering: spares swapped in and every rank restarted from the checkpoint (running again), or no way on
    # (failed, with the reason), or stopped by request while it waits for spares.
    "recovering": frozenset({"running", "failed", "stopped"}),
    # A stop marks the job stopped first (so the threads following its workers see it is over), then ends it.
    "stopped": frozenset({"stopped"}),
    "done": frozenset(),
    "failed": frozenset(),
}


class IllegalTransition(RuntimeError):
    """A state change the table does not allow: a bug in the caller, never a user's error."""


def transition(job: Job, to: str, **fields) -> None:
    """Move `job` to state `to` (and set `fields`, e.g. reason, ended_at) if the table allows it; else raise
    IllegalTransition and change nothing."""
    if to not in TRANSITIONS.get(job.state, ()):
        raise IllegalTransition(f"{job.id or 'a new job'}: {job.state} -> {to} is not a job transition")
    for name in fields:
        if not hasattr(job, name) or name == "state":
            raise AttributeError(f"a job has no field {name!r} to set in a transition")
    job.state = to
    for name, value in fields.items():
        setattr(job, name, value)


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # JSON types as the OpenAPI document says: no "5" for 5
    mode: Literal["profile", "real"] = "profile"
    model: str = Field("vgg16", description="profile mode's workload (profiles/__init__.py)")
    iterations: int = Field(50, ge=1, le=1_000_000)
    compute_seconds: float | None = Field(None, ge=0, le=3600, description="override the profile's compute time")
    batch: int = Field(32, ge=1, le=4096, description="real mode's batch size")

    @model_validator(mode="after")
    def _known_model(self):
        if self.model not in WORKLOADS:  # real mode ignores it, but the document lists the names
            raise ValueError(f"unknown model {self.model!r} (known: {', '.join(sorted(WORKLOADS))})")
        return self


class JobRequest(BaseModel):
    """The body of POST /jobs."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field("", max_length=64)
    gpus: int | list[str] = Field(..., description="how many GPUs, or which ones")
    policy: Literal["fixed", "regroup"] = "regroup"
    gpu_model: str | None = Field(
        None, description="only GPUs of this model; default: any, one model if one has enough"
    )
    queue: bool = Field(True, description="wait in the queue if it cannot be placed now; false: 409 instead")
    estimate_s: float | None = Field(
        None, gt=0, le=10_000_000, description="seconds the job is expected to run (as Slurm's --time); required when "
        "the controller queues by backfill or sjf"
    )
    workload: Workload = Workload()
    collective: Literal["ring", "aggregate"] = Field(
        "ring", description="how its ranks sum their gradients: ring all-reduce, or at an in-network aggregator "
        "(its GPUs placed under a switch whose aggregator has room; a ring, with the reason, where none has)"
    )
    checkpoint_every: int = Field(
        DEFAULT_CHECKPOINT_EVERY,
        ge=1,
        le=1_000_000,
        description="iterations between checkpoints (each saved on the worker's server and on a peer's on another)",
    )
    warm_spares: int = Field(
        DEFAULT_WARM_SPARES,
        ge=0,
        le=8,
        description="per GPU model and per switch the job spans: free GPUs that hold a started worker for this job, "
        "waiting to take a lost GPU's rank",
    )

    @model_validator(mode="after")
    def _gpus(self):
        if isinstance(self.gpus, int) and self.gpus < 1:
            raise ValueError("gpus: at least 1")
        if isinstance(self.gpus, list) and (not self.gpus or len(set(self.gpus)) != len(self.gpus)):
            raise ValueError("gpus: a non-empty list of distinct GPU names")
        return self


@dataclass
class Job:
    id: str
    request: dict
    state: str = NEW
    reason: str | None = None
    gpus: list[str] = field(default_factory=list)  # rank order
    switches: list[str] = field(default_factory=list)
    circuits: list[list[str]] = field(default_factory=list)
    note: str = ""
    created_at: float = 0.0
    admitted_at: float | None = None  # its GPUs granted (placed by the queue: submitted, or a queue drain)
    started_at: float | None = None  # containers started
    ended_at: float | None = None
    events: list[int] = field(default_factory=list)  # reconfiguration event ids
    position: int | None = None  # place in the queue by arrival while queued (1: the next to start under fifo)
    reports: dict[str, list[dict]] = field(default_factory=dict)  # gpu -> worker JSON lines
    exit_codes: dict[str, int] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)  # gpu -> last lines of its output, kept at the end
    image: str | None = None  # the worker image the job ran (repo@digest where a registry serves it)
    attempt: int = 0  # how many times its ranks were restarted from a checkpoint
    recoveries: list[dict] = field(default_factory=list)  # each swap: what was lost, why, the spares, the times
    # The recovery under way while `recovering` (controller/jobs/recovery.py): its step (detected, assessed, swapped,
    # told, restarting), the signs, the GPUs lost, the spares, the attempt; persisted, so that a restarted controller
    # carries it on. Not shown (to_json): once the job runs again it is one of `recoveries`.
    recovery: dict | None = None
    # Stragglers (controller/jobs/detect.py): GPU -> how its rank lags (its compute time against the other ranks'),
    # reported while it still progresses, never swapped.
    lagging: dict[str, str] = field(default_factory=dict)
    # Where its gradients are summed, if it asked for aggregation (controller/jobs/aggregation.py): "collective"
    # (aggregate, or ring with the "reason"), the aggregator's "switch" and "address", its "key" there and the
    # "bytes" of slots reserved. The reservation is this record while the job is active: nothing else holds it.
    aggregation: dict | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def kind(self) -> str:
        """What runs its ranks: "containers" (ours, one per GPU), or "external" (a scheduler outside placed it and runs
        them: controller/jobs/external.py; its request says which, and its job id there)."""
        return "external" if self.request.get("external") else "containers"

    def record(self, gpu: str, line: dict) -> None:
        self.reports.setdefault(gpu, []).append(line)

    def iterations(self) -> list[dict]:
        """One entry per completed iteration: when it ended and how long it took, over all ranks. An iteration redone
        after a recovery counts once, as the latest attempt that completed it on every rank ran it.

        An iteration before a recovery's checkpoint was completed by every rank (the checkpoint was taken after it)
        even where a rank's report of it is missing: a worker's last lines die with its server when the server is
        killed before its engine streamed them. Such an iteration counts, timed by the reports that did arrive."""
        runs: dict[int, dict[int, list[dict]]] = {}  # iteration -> attempt -> the ranks' reports
        for reports in self.reports.values():
            for r in reports:
                if r.get("event") == "iteration":
                    runs.setdefault(r["iteration"], {}).setdefault(r.get("attempt", 0), []).append(r)
        proven = max((rec.get("resumed_from") or 0 for rec in self.recoveries), default=0)
        out = []
        for i in range(len(runs)):
            attempts = [its for _, its in sorted(runs.get(i, {}).items())]
            complete = [its for its in attempts if len(its) >= len(self.gpus)]
            if not complete and i < proven and attempts:
                complete = [max(reversed(attempts), key=len)]  # the latest attempt with the most reports
            if not complete:
                break
            its = complete[-1]
            out.append(
                {
                    "iteration": i,
                    "t_start": min(x["t_start"] for x in its),
                    "t_end": max(x["t_end"] for x in its),
                    "iter_s": max(x["iter_s"] for x in its),
                    "compute_s": max(x["compute_s"] for x in its),
                    "comm_s": max(x["comm_s"] for x in its),
                    "gpu_util": statistics.fmean(x["gpu_util"] for x in its),
                }
            )
        return out

    def completion_s(self) -> float | None:
        """From the first iteration's start to the last one's end (all ranks)."""
        its = self.iterations()
        if self.state != "done" or not its:
            return None
        return its[-1]["t_end"] - its[0]["t_start"]

    def summary(self) -> dict:
        its = self.iterations()
        total = self.request.get("workload", {}).get("iterations")
        d = {k: v for k, v in asdict(self).items() if k not in ("reports", "logs", "recovery")}
        d.update(
            iterations_done=len(its),
            iterations_total=total,
            completion_s=self.completion_s(),
            mean_iteration_s=statistics.fmean(i["iter_s"] for i in its) if its else None,
            mean_gpu_util=statistics.fmean(i["gpu_util"] for i in its) if its else None,
        )
        return d

    def to_json(self, detail: bool = False) -> dict:
        d = self.summary()
        if detail:
            d["iteration_log"] = self.iterations()
            d["ranks"] = {g: [r for r in self.reports.get(g, []) if r.get("event") == "iteration"] for g in self.gpus}
            kept = ("checkpoint", "restored")
            d["checkpoints"] = {g: [r for r in self.reports.get(g, []) if r.get("event") in kept] for g in self.gpus}
        return d

    def to_state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, data: dict) -> Job:
        return cls(**data)


class JobTable(dict):
    """Jobs by id, in creation order. It remembers the jobs that may still change (added since the
    last save, active or queued), so that a save writes those and not the whole history."""

    def __init__(self, jobs: Iterable[Job] = ()):
        super().__init__()
        self.live: dict[str, Job] = {}
        for job in jobs:
            super().__setitem__(job.id, job)
            if job.state not in TERMINAL:  # active or queued
                self.live[job.id] = job

    def __setitem__(self, job_id: str, job: Job) -> None:
        super().__setitem__(job_id, job)
        self.live[job_id] = job

    def update(self, *args, **kw) -> None:
        for job_id, job in dict(*args, **kw).items():
            self[job_id] = job

    def __delitem__(self, job_id: str) -> None:
        super().__delitem__(job_id)
        self.live.pop(job_id, None)

    def to_save(self, also: Job | None = None) -> list[Job]:
        """What a save must write: the live jobs, and `also` (a job that changed after it ended)."""
        return list(self.live.values()) + ([also] if also is not None and also.id not in self.live else [])

    def saved(self, jobs: Iterable[Job]) -> None:
        """These were written: the ended ones need not be written again unless named."""
        for job in jobs:
            if job.state in TERMINAL:
                self.live.pop(job.id, None)

"""What every step of a job's life shares: its log, its limits, and how a failed step is reported or passed over."""

from __future__ import annotations

import logging

from controller.core import placement as policy
from controller.core.circuits import displaced
from controller.core.errors import Conflict, OcsUnavailable, ReconfigFailed
from controller.core.jobs import Job
from controller.jobs.ports import ContainerError, EngineDown

LOG = logging.getLogger("optirack.placement")
RECONFIG_WAIT = 120.0  # seconds a job waits for another reconfiguration to finish
LOG_LINES = 50  # last lines of each worker's output kept when its job ends
KEPT_PLANS = 8  # defragmentation plans remembered for `POST /regroup {"version": N}`
EXPECTED = (policy.PlacementError, ReconfigFailed, OcsUnavailable, Conflict, ContainerError, EngineDown)


def _reason(e: BaseException) -> str:
    """A failed job's reason: the message of an error we expect, the error's type too for any other."""
    return str(e) if not _unexpected(e) else f"{type(e).__name__}: {e}"


def _unexpected(e: BaseException | None) -> bool:
    return e is not None and not isinstance(e, EXPECTED)


def _attempt(job: Job, what: str, step, *args) -> None:
    """Run one clean-up step; log its failure and go on with the next."""
    try:
        step(*args)
    except Exception:  # noqa: BLE001 (clean-up goes on whatever one step raised)
        LOG.exception("%s: %s failed", job.id, what)


def request_of(job: Job, named: bool = False, confined: bool = True) -> policy.Request:
    """The placement request of `job` (`named`: for the GPUs it was given; `confined`: under its aggregator's switch
    if it aggregates, controller/jobs/aggregation.py)."""
    r, agg = job.request, job.aggregation or {}
    gpus = job.gpus if named else r["gpus"]
    return policy.Request(
        gpus if isinstance(gpus, int) else tuple(gpus),
        r["policy"],
        r.get("gpu_model"),
        r["workload"].get("model", "vgg16"),
        (agg["switch"],) if confined and agg.get("collective") == "aggregate" else None,
    )


def displaced_note(rack, diff, gpus) -> str:
    """What an event should say: the idle GPUs whose circuits the job took (no free port was left)."""
    moved = displaced(rack, diff, gpus)
    return "; ".join(moved) + " (no free switch port was left)" if moved else ""

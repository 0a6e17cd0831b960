"""Admission: which queued job is tried next, and when the queue stops. One definition, called by the controller's
placement (controller/jobs/admission.py) and by the simulator (simulator/model/engine.py).

A policy is a function `drain(queue, attempt, cluster=None)`: it calls `attempt(job)` for the jobs it chooses, in its
order, and takes out of `queue` each job whose attempt did not answer WAIT. `attempt` places the job (PLACED), or
finds it can never run here (REFUSED: the caller ends it), or finds no room now (WAIT).

`fifo` needs nothing more. The others need to know the cluster: a `Cluster` (below) gives the free GPUs, each job's
size and estimated run time, the running jobs with their estimated ends and the service they attained, and can
preempt a running job (the caller stops it, keeps its progress and puts it back in `queue` at its place by
arrival).

- `fifo`: first in, first out, with head-of-line blocking.
- `backfill`: EASY backfilling. The first waiting job gets a reservation: the earliest time enough GPUs free up by
  the running jobs' estimated ends (its shadow time). A later job may start now if it fits in the free GPUs and
  either ends (by its estimate) before the shadow time, or uses only GPUs the reserved job will not need then.
- `sjf`: shortest (estimated) job first; the shortest job that waits blocks the longer ones behind it.
- `las`: least attained service with preemption, Tiresias-like: a job's attained service is GPUs x seconds run;
  jobs are ranked by priority level (attained service below each of `LAS_THRESHOLDS` GPU-seconds: level 0, 1, ...)
  and first come first served within a level; a waiting job whose level is better than running jobs' preempts them,
  the worst level and most attained service first, when that frees enough GPUs for it; a job that cannot start is
  passed over (work-conserving), so a later one that fits starts.
"""

from __future__ import annotations

import bisect
import enum
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T", bound=Hashable)

LAS_THRESHOLDS: tuple[float, ...] = (3600.0, 36_000.0)
"""GPU-seconds of attained service at which a job drops to the next level (one GPU-hour, ten). Tiresias' evaluation
uses two levels whose threshold it tunes per trace; these are this project's assumptions, documented in
docs/simulator.md#schedulers."""


class Outcome(enum.Enum):
    PLACED = "placed"
    REFUSED = "refused"
    WAIT = "wait"


@dataclass(frozen=True)
class Running:
    job: Hashable
    gpus: int
    end_s: float  # its estimated end
    attained: float  # GPU-seconds of service so far
    preemptible: bool = True  # false for a job the caller cannot stop now (e.g. being moved)


class Cluster(Protocol):
    """What the policies other than fifo ask of the cluster."""

    now: float

    def free(self) -> int: ...

    def gpus(self, job) -> int: ...

    def estimate(self, job) -> float: ...  # seconds it will run from now (the whole run when not started)

    def attained(self, job) -> float: ...  # GPU-seconds it ran so far

    def running(self) -> Sequence[Running]: ...  # the jobs that may be preempted or whose end frees GPUs

    def preempt(self, job) -> None: ...  # stop it, keep its progress, put it back in the queue by arrival


def fifo(queue: deque[T], attempt: Callable[[T], Outcome], cluster: Cluster | None = None) -> None:
    """First in, first out, with head-of-line blocking: a later small job never overtakes an earlier large one that
    waits for room."""
    while queue:
        if attempt(queue[0]) is Outcome.WAIT:
            return
        queue.popleft()


def shadow(cluster: Cluster, need: int) -> tuple[float, int]:
    """When `need` GPUs will be free at the latest, by the running jobs' estimated ends, and how many GPUs will be
    free beyond `need` then (EASY's shadow time and extra GPUs). Never, when the running jobs cannot free enough."""
    free = cluster.free()
    if free >= need:
        return cluster.now, free - need
    for r in sorted(cluster.running(), key=lambda r: r.end_s):
        free += r.gpus
        if free >= need:
            return r.end_s, free - need
    return float("inf"), 0


def backfill(queue: deque[T], attempt: Callable[[T], Outcome], cluster: Cluster) -> None:
    """EASY backfilling: fifo until the first job waits; then later jobs start only where they do not delay the
    first one's reservation (its shadow time) by the estimates."""
    fifo(queue, attempt)
    if len(queue) < 2:
        return
    head = queue[0]
    when, extra = shadow(cluster, cluster.gpus(head))
    free = cluster.free()
    placed = set()
    for job in list(queue)[1:]:
        if free <= 0:
            break
        n = cluster.gpus(job)
        if n > free:
            continue
        ends_first = cluster.now + cluster.estimate(job) <= when
        if not ends_first and n > extra:
            continue
        outcome = attempt(job)
        if outcome is Outcome.WAIT:
            continue
        placed.add(job)
        if outcome is Outcome.PLACED:
            free = cluster.free()
            if not ends_first:
                extra -= n
    if placed:
        kept = [j for j in queue if j not in placed]
        queue.clear()
        queue.extend(kept)


def sjf(queue: deque[T], attempt: Callable[[T], Outcome], cluster: Cluster) -> None:
    """Shortest estimated run first (ties: first come); the shortest that waits blocks the rest."""
    order = sorted(range(len(queue)), key=lambda i: (cluster.estimate(queue[i]), i))
    done = set()
    for i in order:
        if attempt(queue[i]) is Outcome.WAIT:
            break
        done.add(i)
    if done:
        kept = [j for i, j in enumerate(queue) if i not in done]
        queue.clear()
        queue.extend(kept)


def level(attained: float, thresholds: Sequence[float] = LAS_THRESHOLDS) -> int:
    """A job's priority level by its attained service: 0 below the first threshold, and so on (lower runs first)."""
    return bisect.bisect_right(thresholds, attained)


def las(queue: deque[T], attempt: Callable[[T], Outcome], cluster: Cluster,
        thresholds: Sequence[float] = LAS_THRESHOLDS) -> None:
    """Least attained service, by levels, first come first served within one; a waiting job preempts running jobs of a
    worse level when that frees enough GPUs for it. Work-conserving, as Tiresias: a job that still waits is passed
    over and the next is tried. A second pass, without preemption, gives the preempted jobs' GPUs to whoever fits."""
    done: set = set()
    preempted = False
    for allow in (True, False):
        order = sorted((i for i in range(len(queue)) if queue[i] not in done),
                       key=lambda i: (level(cluster.attained(queue[i]), thresholds), i))
        for job in [queue[i] for i in order]:
            if cluster.free() <= 0 and not allow:
                break
            outcome = attempt(job)
            if outcome is Outcome.WAIT and allow:
                chosen = _victims(cluster, job, thresholds)
                for v in chosen:
                    cluster.preempt(v)
                preempted = preempted or bool(chosen)
                outcome = attempt(job) if chosen else outcome
            if outcome is not Outcome.WAIT:
                done.add(job)
        if not preempted:
            break
    if done:
        kept = [j for j in queue if j not in done]
        queue.clear()
        queue.extend(kept)


def _victims(cluster: Cluster, job, thresholds: Sequence[float]) -> list:
    """The running jobs of a worse level than `job` to stop so that it fits, worst level and most attained first;
    none when stopping all of them would not free enough."""
    mine = level(cluster.attained(job), thresholds)
    worse = sorted((r for r in cluster.running() if r.preemptible and level(r.attained, thresholds) > mine),
                   key=lambda r: (-level(r.attained, thresholds), -r.attained))
    need, free, chosen = cluster.gpus(job), cluster.free(), []
    for r in worse:
        if free >= need:
            break
        chosen.append(r.job)
        free += r.gpus
    return chosen if free >= need else []


POLICIES: dict[str, Callable[..., None]] = {"fifo": fifo, "backfill": backfill, "sjf": sjf, "las": las}
NEEDS_CLUSTER = frozenset({"backfill", "sjf", "las"})

"""Admission: which queued job is tried next, and when the queue stops. One definition, called by the controller's
placement (controller/apps/placement.py) and by the simulator (simulator/engine.py).

A policy is a function `drain(queue, attempt)`: it calls `attempt(job)` for the jobs it chooses, in its order, and
takes out of `queue` each job whose attempt did not answer WAIT. `attempt` places the job (PLACED), or finds it can
never run here (REFUSED: the caller ends it), or finds no room now (WAIT).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Outcome(enum.Enum):
    PLACED = "placed"
    REFUSED = "refused"
    WAIT = "wait"


def fifo(queue: deque[T], attempt: Callable[[T], Outcome]) -> None:
    """First in, first out, with head-of-line blocking: a later small job never overtakes an earlier large one that
    waits for room."""
    while queue:
        if attempt(queue[0]) is Outcome.WAIT:
            return
        queue.popleft()


POLICIES: dict[str, Callable[[deque, Callable[[object], Outcome]], None]] = {"fifo": fifo}

"""The GPU-seconds a simulated run computed: the rows simulator/model/interference.py adds each time it settles a
component
of rings, and the engine adds for replayed jobs (utilization over time and goodput come from them)."""
from __future__ import annotations

from array import array


class Busy:
    """GPU-seconds computed, as (from, to, GPU-seconds) rows in typed arrays: one row per component each time it is
    settled (its rings' iterations done since it was solved, times each ring's compute per iteration), 24 bytes a
    row; iterated as tuples."""

    def __init__(self):
        self.t0, self.t1, self.amount = array("d"), array("d"), array("d")

    def add(self, t0: float, t1: float, amount: float) -> None:
        self.t0.append(t0)
        self.t1.append(t1)
        self.amount.append(amount)

    def __len__(self) -> int:
        return len(self.t0)

    def __iter__(self):
        return zip(self.t0, self.t1, self.amount, strict=True)

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


class Rows:
    """Rows of numbers kept as one typed array per column (`codes`: "d" a float, "q" an integer): 8 bytes a number,
    not a tuple of number objects per row; appended and iterated as tuples, as a list of them would be. A run's
    GPUs held (from, to, GPUs) and its fragmentation samples (time, most free under one switch, free)."""

    def __init__(self, codes: str):
        self.columns = tuple(array(c) for c in codes)

    def append(self, row: tuple) -> None:
        for column, value in zip(self.columns, row, strict=True):
            column.append(value)

    def __len__(self) -> int:
        return len(self.columns[0])

    def __iter__(self):
        return zip(*self.columns, strict=True)

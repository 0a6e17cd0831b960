"""Reconfiguration events: every circuit change, with its timestamps; the recent ones kept in memory."""
from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields


@dataclass
class ReconfigEvent:
    """One reconfiguration. Times are wall-clock seconds (epoch); durations are derived."""

    id: int
    kind: str  # "circuits" (PUT), "restore" (a reconnected OCS), "job", "regroup" (placement), "failover" (spares)
    reason: str
    requested_at: float
    removed: list[list[str]] = field(default_factory=list)
    added: list[list[str]] = field(default_factory=list)
    dark_start: float | None = None  # old circuits gone
    dark_end: float | None = None  # new circuits confirmed by the OCS
    ocs_confirmed_at: float | None = None
    flows_confirmed_at: float | None = None
    # the packet switches' re-programming for the new circuits: from its start (once every changed circuit is
    # dark, so it runs inside the dark window) until every switch confirmed it
    fabric_started_at: float | None = None
    fabric_confirmed_at: float | None = None
    switching_time_s: float = 0.0  # what the OCS model or device promises
    status: str = "running"  # running | ok | failed
    error: str | None = None
    job: str | None = None
    version: int | None = None  # the circuit map's version this change left (the REST ETag)
    note: str = ""  # what a reader should know, e.g. an idle GPU's circuit a placement moved

    @property
    def dark_window_s(self) -> float | None:
        if self.dark_start is None or self.dark_end is None:
            return None
        return self.dark_end - self.dark_start

    @property
    def total_s(self) -> float | None:
        end = self.flows_confirmed_at
        return None if end is None else end - self.requested_at

    def to_state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, data: dict) -> ReconfigEvent:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def to_json(self) -> dict:
        d = asdict(self)
        d["dark_window_s"] = self.dark_window_s
        d["total_s"] = self.total_s
        d["overhead_s"] = None if self.total_s is None else self.total_s - self.switching_time_s
        return d


class EventLog:
    """The last `size` reconfigurations, newest last."""

    def __init__(self, size: int = 1000, start_id: int = 1):
        self.size = size
        self._events: deque[ReconfigEvent] = deque(maxlen=size)
        self._ids = itertools.count(start_id)

    def load(self, events: Iterable[ReconfigEvent]) -> None:
        """Events of an earlier run, oldest first (their ids are below start_id)."""
        self._events.extend(events)

    def start(self, kind: str, reason: str, now: float, **kw) -> ReconfigEvent:
        ev = ReconfigEvent(id=next(self._ids), kind=kind, reason=reason, requested_at=now, **kw)
        self._events.append(ev)
        return ev

    def recent(self, limit: int | None = None) -> list[ReconfigEvent]:
        events = list(self._events)
        return events if limit is None else events[-limit:]

    def get(self, event_id: int) -> ReconfigEvent | None:
        return next((e for e in self._events if e.id == event_id), None)

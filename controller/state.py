"""The rack's state, as the controller holds and persists it: the rack, its circuit map and the map's version, the
reconfiguration events, the state database and the clock. No Ryu, no I/O beyond the database.

The controller's wiring (controller/apps/context.py) makes one and hands it to each part that needs it: the circuit
changes (controller/devices/changes.py), the OCS and packet-switch keepers, and the job service (controller/jobs/).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from controller.core.cabling import CircuitError
from controller.core.circuits import CircuitMap
from controller.core.events import EventLog, ReconfigEvent
from controller.core.rack import Rack
from controller.store import Store, StoreError

LOG = logging.getLogger("optirack")


def open_store(state_dir: Path, rack: str, clock) -> Store:
    """The state database (importing a legacy state.json); one of another rack is moved aside, not mixed in.
    Exits (2) naming the database if it cannot be opened."""
    path = state_dir / "state.db"
    try:
        store = Store(path, legacy=state_dir / "state.json", clock=clock)
        other = store.rack()
        if other not in (None, rack):
            store.close()
            aside = path.with_name(f"state-{other}-{int(clock())}.db")
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{path}{suffix}").exists():
                    Path(f"{path}{suffix}").rename(f"{aside}{suffix}")
            LOG.warning("%s belonged to rack %r, not %r: moved it to %s and started afresh", path, other, rack, aside)
            store = Store(path, clock=clock)
    except StoreError as e:
        LOG.error("cannot start: %s", e)
        sys.exit(2)
    return store


class RackState:
    """The rack being controlled, its circuits and their version (the REST ETag: every change of the map bumps it, so
    a change planned from an older version can be refused), the recent events, the store, the clock, and the
    reconfiguration lock (one change of the circuits at a time)."""

    def __init__(self, rack: Rack, store: Store, clock: Callable[[], float], lock):
        self.rack, self.store, self.clock, self.lock = rack, store, clock, lock
        self.saved = self.store.load()  # the state at start: circuits, their version, jobs
        self.events = self._load_events()
        self.circuits_version = int(self.saved.get("circuits_version", 0))
        self._circuits = self._initial_circuits()
        self.adopt_device_circuits = "circuits" not in self.saved

    def _load_events(self) -> EventLog:
        """The recent events; one left running by a controller that stopped mid-change ends failed."""
        for data in self.store.unfinished_events():
            ev = ReconfigEvent.from_state(data)
            ev.status, ev.error = "failed", "the controller stopped before this change finished"
            self.store.save(events=[ev.to_state()])
        log = EventLog(start_id=self.store.last_event_id() + 1)
        log.load(ReconfigEvent.from_state(d) for d in self.store.events(log.size))
        return log

    def _initial_circuits(self) -> CircuitMap:
        if "circuits" in self.saved:
            try:
                return CircuitMap.parse(self.rack, self.saved["circuits"])
            except CircuitError as e:
                LOG.warning("saved circuits do not fit the rack (%s): starting from the rack file's", e)
                self.circuits_version += 1
        return CircuitMap.initial(self.rack)

    @property
    def circuits(self) -> CircuitMap:
        return self._circuits

    @circuits.setter
    def circuits(self, value: CircuitMap) -> None:
        if value != self._circuits:
            self._circuits = value
            self.circuits_version += 1

    def save(self, jobs=(), events=()) -> None:
        """One transaction: the circuit map and its version, and these jobs and events (whole states)."""
        meta = {"rack": self.rack.name, "circuits": self.circuits.to_json(), "circuits_version": self.circuits_version}
        self.store.save(meta=meta, jobs=jobs, events=[e.to_state() for e in events])

    def record_event(self, ev: ReconfigEvent) -> None:
        """Persist one reconfiguration event as it is now (when it starts and when it ends)."""
        self.store.save(events=[ev.to_state()])

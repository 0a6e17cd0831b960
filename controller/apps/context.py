"""The state the optirack apps share: one object per ryu-manager, handed to each app as a Ryu context."""
from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import time
from pathlib import Path

from ryu import cfg

from controller.apps.runtime import HUB
from controller.config import conf
from controller.core.circuits import CircuitError, CircuitMap
from controller.core.events import EventLog, ReconfigEvent
from controller.core.rack import Rack, RackError, load_rack
from controller.core.stats import PortHistory
from controller.jobs.errors import Busy, Conflict  # noqa: F401 (the apps' names for them)
from controller.store import Store, StoreError

LOG = logging.getLogger("optirack")


def _load_token(path: Path) -> str:
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    LOG.info("made a new REST token in %s", path)
    return token


def _check_port_free(host: str, port: int, what: str) -> None:
    """eventlet listens with SO_REUSEPORT, so a second controller would silently share the port."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT, still see a listener
        try:
            s.bind((host, port))
        except OSError as e:
            LOG.error(
                "cannot start: %s port %s:%d is in use (%s); is another controller running?",
                what,
                host,
                port,
                e.strerror,
            )
            sys.exit(2)


def _open_store(state_dir: Path, rack: str, clock) -> Store:
    """The state database (importing a legacy state.json); one of another rack is moved aside, not mixed in."""
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


class Optirack:
    """The rack being controlled, its circuits, and what is known of its datapaths."""

    def __init__(self, rack: Rack | None = None, state_dir: Path | None = None, clock=time.time, runtime=None):
        c = conf()
        if rack is None:  # the real controller, not a test's
            ryu_conf = cfg.CONF
            _check_port_free(ryu_conf.ofp_listen_host or "0.0.0.0", ryu_conf.ofp_tcp_listen_port or 6653, "OpenFlow")
            _check_port_free(ryu_conf.wsapi_host, ryu_conf.wsapi_port, "REST")
            try:
                rack = load_rack(c.rack)
            except RackError as e:
                LOG.error("cannot start: %s", e)
                sys.exit(2)
        self.rack, self.clock = rack, clock
        self.state_dir = Path(state_dir or c.state_dir)
        self.token = _load_token(Path(c.token_file) if c.token_file else self.state_dir / "token")
        self.known = rack.datapaths()  # dpid -> ("ocs" | "switch", name)
        self.datapaths: dict[int, object] = {}  # connected ones, dpid -> ryu Datapath
        self.ports = PortHistory(c.monitor_history)
        self.store = _open_store(self.state_dir, rack.name, clock)
        self.saved = self.store.load()  # the state at start: circuits, their version, jobs
        self.events = self._load_events()
        # The circuit map and its version (the REST ETag): every change of the map bumps it, so a
        # change planned from an older version can be refused (OcsApp.change, PUT with If-Match).
        self.circuits_version = int(self.saved.get("circuits_version", 0))
        self._circuits = self._initial_circuits()
        self.adopt_device_circuits = "circuits" not in self.saved
        self.rt = runtime or HUB  # threads, sleeps, locks: Ryu's hub, or a test's virtual clock
        self.lock = self.rt.lock()  # one reconfiguration at a time
        # Services the apps register themselves as; each is set by its app's constructor.
        self.ocs = None
        self.fabric = None
        self.placement = None
        self.metrics = None

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

    def name_of(self, dpid: int) -> str:
        kind, name = self.known.get(dpid, ("unknown", f"{dpid:#x}"))
        return name if kind != "unknown" else f"unknown datapath {name}"

    def dpid_of(self, name: str) -> int:
        return next(d for d, (_, n) in self.known.items() if n == name)

    def connected(self, name: str) -> bool:
        return self.dpid_of(name) in self.datapaths

    def protected_ports(self, circuits: CircuitMap | None = None) -> dict:
        """OCS ports whose circuits belong to active jobs (in `circuits`, default the current map):
        PortRef -> job id."""
        return self.placement.protected_ports(circuits=circuits) if self.placement else {}

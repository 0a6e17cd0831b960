"""The controller's wiring: one object per ryu-manager, handed to each app as a Ryu context. It builds every part from
the parts it needs, in order, and holds them for the apps that adapt Ryu's events to them:

    rack state (controller/state.py: rack, circuits and their version, events, store, clock, lock)
    -> fabric: the packet switches' keeper (controller/devices/fabric.py)
    -> ocs: the OCS keeper (controller/devices/ocs.py), which builds the circuit changes over its drivers and the
       fabric (controller/devices/changes.py) = `changes`
    -> jobs: the job service (controller/jobs/service.py), from the rack state, the circuit changes, the containers
       (controller/drivers/containers.py), the runtime and the outside scheduler of external jobs, if one is
       configured (`scheduler`: Slurm's port, controller/slurm/scheduler.py, for --optirack-slurm-conf)
    -> metrics: the Prometheus registry over all of them (controller/metrics.py).

No part finds another through this object: each gets its collaborators in its constructor. Threads start when the
app that owns a part starts it (the OCS app its keepers, the placement app the job service)."""
from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ryu import cfg

from controller.apps.runtime import HUB
from controller.config import conf
from controller.core import aggregators
from controller.core.circuits import CircuitMap
from controller.core.rack import Rack, RackError, load_rack
from controller.core.stats import PortHistory
from controller.devices.fabric import Fabric
from controller.devices.ocs import OcsDevices
from controller.drivers.containers import ContainerDriver
from controller.jobs.ports import SchedulerPort
from controller.jobs.service import JobService
from controller.metrics import Metrics
from controller.slurm.scheduler import configured
from controller.state import RackState, open_store

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


class Optirack(RackState):
    """The rack state, what is known of the rack's datapaths, and the parts built over them."""

    def __init__(
        self,
        rack: Rack | None = None,
        state_dir: Path | None = None,
        clock=time.time,
        runtime=None,
        containers=None,
        engine_poll: float | None = None,
        scheduler: SchedulerPort | None = None,
    ):
        c = conf()
        if rack is None:  # the real controller, not a test's (a test hands in its scheduler, if any)
            ryu_conf = cfg.CONF
            _check_port_free(ryu_conf.ofp_listen_host or "0.0.0.0", ryu_conf.ofp_tcp_listen_port or 6653, "OpenFlow")
            _check_port_free(ryu_conf.wsapi_host, ryu_conf.wsapi_port, "REST")
            try:
                rack = load_rack(c.rack)
                aggregators.check(rack)
            except RackError as e:
                LOG.error("cannot start: %s", e)
                sys.exit(2)
            scheduler = scheduler or configured(rack, c.slurm_conf)
        self.state_dir = Path(state_dir or c.state_dir)
        self.token = _load_token(Path(c.token_file) if c.token_file else self.state_dir / "token")
        self.known = rack.datapaths()  # dpid -> ("ocs" | "switch", name)
        self.datapaths: dict[int, Any] = {}  # connected ones, dpid -> ryu Datapath
        self.ports = PortHistory(c.monitor_history)
        self.rt = runtime or HUB  # threads, sleeps, locks: Ryu's hub, or a test's virtual clock
        super().__init__(rack, open_store(self.state_dir, rack.name, clock), clock, self.rt.lock())
        self.fabric = Fabric(self, self.rt, c.barrier_timeout)
        self.ocs = OcsDevices(self, self.fabric, self.rt, c)
        self.changes = self.ocs.changes
        self.scheduler = scheduler
        self.jobs = JobService(
            self,
            self.changes,
            containers or ContainerDriver(rack, c.worker_image, nic_home=c.nic_home),
            self.rt,
            engine_poll=engine_poll or c.engine_poll,
            hold_configuring=c.fault_hold_configuring,
            hold_recovering=c.fault_hold_recovering,
            queue=c.queue,
            scheduler=scheduler,
            aggregators=self.fabric,
        )
        self.metrics = Metrics(self)  # what GET /metrics shows (controller/apps/metrics.py), read when scraped

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
        return self.jobs.protected_ports(circuits=circuits)

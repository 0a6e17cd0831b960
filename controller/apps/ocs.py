"""The OCS app: holds the circuit map, drives each OCS through its driver, restores a reconnected OCS."""
from __future__ import annotations

import logging

from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.ofproto import ofproto_v1_3

from controller.apps.confirm import ConfirmingApp
from controller.apps.context import Optirack
from controller.config import conf
from controller.core.circuits import CircuitError, CircuitMap
from controller.core.events import ReconfigEvent
from controller.core.rack import PortRef
from controller.drivers.ocs import OcsDriver, OpenFlowOcs
from controller.drivers.openflow import OfRpc
from controller.drivers.tl1 import Tl1Ocs
from controller.jobs.changes import DEVICE_ERRORS, CircuitChanges, pairs
from controller.jobs.errors import Busy, ReconfigFailed  # noqa: F401 (the apps' names for them)

LOG = logging.getLogger("optirack.ocs")


class OcsApp(ConfirmingApp, app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        self.ctx.ocs = self
        self.rt = self.ctx.rt
        self.rpc = OfRpc(self.rt.event)
        self.synchronised: set[str] = set()  # OCS whose circuits match ours since they connected
        c = conf()
        self.drivers: dict[str, OcsDriver] = {}
        for spec in self.ctx.rack.spec.ocs:
            if spec.driver == "tl1":
                self.drivers[spec.name] = Tl1Ocs(
                    spec, c.tl1_user, c.tl1_password, lock=self.rt.lock(), sleep=self.rt.sleep
                )
            else:
                self.drivers[spec.name] = OpenFlowOcs(spec, self.rpc, c.barrier_timeout, sleep=self.rt.sleep)
        self.changes = CircuitChanges(self.ctx, self.drivers, self._resynchronise_later)
        # An OpenFlow OCS connects to us (and again after a loss); any other device is kept by a
        # thread of ours: it logs in, resynchronises, probes, and after a loss retries with backoff.
        self.probe_interval, self.retry_max = c.device_probe_interval, c.device_retry_max
        self.keepers = [
            self.rt.spawn(self._keep, name) for name, d in self.drivers.items() if not isinstance(d, OpenFlowOcs)
        ]

    # --- OpenFlow events -------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        kind, name = self.ctx.known.get(ev.datapath.id, (None, None))
        if kind != "ocs" or not isinstance(self.drivers.get(name), OpenFlowOcs):
            return
        if ev.state == MAIN_DISPATCHER:
            self.drivers[name].datapath = ev.datapath
            self.rt.spawn(self._synchronise, name)
        else:
            self.drivers[name].datapath = None
            self.synchronised.discard(name)
            self.rpc.on_disconnect(ev.datapath.id)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev):
        """A port of an OCS changed: a GPU's NIC whose link drops is lost to its job (controller/jobs/failover.py)."""
        kind, name = self.ctx.known.get(ev.msg.datapath.id, (None, None))
        if kind != "ocs" or self.ctx.placement is None:
            return
        desc, ofp = ev.msg.desc, ofproto_v1_3
        up = not (desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)
        LOG.info("OCS %s port %s: link %s", name, desc.port_no, "up" if up else "down")
        self.ctx.placement.link_changed(PortRef(name, desc.port_no), up)

    # --- circuits ------------------------------------------------------------------
    def _keep(self, name: str, first_retry: float = 0.5) -> None:
        """Keep a device that does not connect to us in step: (re)synchronise it, retried with
        backoff while it is unreachable, then probe it every probe_interval."""
        delay = first_retry
        while True:
            try:
                if name in self.synchronised:
                    self.rt.sleep(self.probe_interval)
                    self._probe(name)
                    continue
                ok = self._synchronise(name)
            except Exception:  # noqa: BLE001 (a bug must not end the keeper: log it and retry)
                LOG.exception("OCS %s: keeping it in step raised", name)
                ok = False
            if ok:
                delay = first_retry
            else:
                LOG.info("OCS %s: next try in %.1f s", name, delay)
                self.rt.sleep(delay)
                delay = min(delay * 2, self.retry_max)

    def _probe(self, name: str) -> None:
        """Ask the device what it holds; a lost session, or circuits other than ours, make it resynchronise."""
        if self.ctx.lock.locked():
            return  # a reconfiguration is changing the devices now; probe next time
        try:
            device = self.drivers[name].read()
        except DEVICE_ERRORS as e:
            LOG.warning("OCS %s: %s", name, e)
            self.synchronised.discard(name)
            return
        if device != pairs(self.ctx.circuits.on(name)) and not self.ctx.lock.locked():
            LOG.warning("OCS %s holds other circuits than ours: resynchronising", name)
            self.synchronised.discard(name)

    def _synchronise(self, name: str) -> bool:
        """A (re)connected OCS: adopt its circuits on first contact, else restore the ones we hold."""
        with self.ctx.lock:
            driver = self.drivers[name]
            try:
                device = driver.read()
                # First contact and no saved state: a device that has circuits is the truth;
                # an empty one (new, or reset) gets the rack file's starting circuits.
                if not (self.ctx.adopt_device_circuits and device and self._adopt(name, device)):
                    self._restore(name, driver, device)
                self.synchronised.add(name)
                self.ctx.adopt_device_circuits = False
            except DEVICE_ERRORS as e:
                LOG.warning("OCS %s: cannot synchronise: %s", name, e)
                return False
        if self.ctx.fabric:
            self.ctx.fabric.sync_quietly()
        return True

    def _restore(self, name: str, driver: OcsDriver, device: set[tuple[int, int]]) -> None:
        held = pairs(self.ctx.circuits.on(name))
        if device == held:
            LOG.info("OCS %s: holds the expected %d circuits", name, len(held))
            return
        ev = self.ctx.events.start(
            "restore",
            f"OCS {name} connected with other circuits",
            self.ctx.clock(),
            removed=[[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(device - held)],
            added=[[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(held - device)],
        )
        try:
            self.ctx.record_event(ev)
            driver.replace(held)
            ev.ocs_confirmed_at = ev.flows_confirmed_at = self.ctx.clock()
            ev.status = "ok"
        except Exception as e:
            ev.status, ev.error = "failed", f"{e}"
            raise
        finally:
            self.changes.close(ev)
        self.ctx.save()
        LOG.info("OCS %s: restored %d circuits", name, len(held))

    def _adopt(self, name: str, device: set[tuple[int, int]]) -> bool:
        others = [[str(a), str(b)] for a, b in self.ctx.circuits.circuits if a.device != name]
        mine = [[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(device)]
        try:
            adopted = CircuitMap.parse(self.ctx.rack, others + mine)
        except CircuitError as e:
            LOG.warning("OCS %s has circuits that do not fit the rack (%s); imposing the rack file's", name, e)
            return False
        self.ctx.circuits = adopted
        self.ctx.save()
        LOG.info("OCS %s: adopted its %d circuits", name, len(device))
        return True

    # --- changes: the transaction lives in controller/jobs/changes.py -------------------
    def change(self, *args, **kwargs) -> ReconfigEvent | None:
        return self.changes.change(*args, **kwargs)

    def reconfigure(self, *args, **kwargs) -> ReconfigEvent | None:
        return self.changes.reconfigure(*args, **kwargs)

    def check_available(self, target: CircuitMap) -> None:
        self.changes.check_available(target)

    def _resynchronise_later(self, name: str) -> None:
        """An OCS whose state is unknown: its keeper (TL1) or a retrier of ours (OpenFlow) restores it."""
        self.synchronised.discard(name)
        if isinstance(self.drivers[name], OpenFlowOcs):
            self.rt.spawn(self._retry_synchronise, name)

    def _retry_synchronise(self, name: str, delay: float = 0.5) -> None:
        while name not in self.synchronised and self.drivers[name].connected:
            self.rt.sleep(delay)
            if not self._synchronise(name):
                delay = min(delay * 2, self.retry_max)

    def device_circuits(self) -> dict[str, list[list[str]] | None]:
        """What each connected OCS reports now (None if it is not connected or cannot be asked)."""
        result = {}
        for name, driver in self.drivers.items():
            try:
                result[name] = (
                    [[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(driver.read())] if driver.connected else None
                )
            except DEVICE_ERRORS:
                result[name] = None
        return result

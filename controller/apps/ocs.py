"""The OCS app: holds the circuit map, drives each OCS through its driver, restores a reconnected OCS."""
from __future__ import annotations

import logging

from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.lib import hub
from ryu.ofproto import ofproto_v1_3

from controller.apps.confirm import ConfirmingApp
from controller.apps.context import Busy, Optirack
from controller.config import conf
from controller.core.circuits import CircuitError, CircuitMap
from controller.core.events import ReconfigEvent
from controller.drivers.ocs import OcsDriver, OcsUnavailable, OpenFlowOcs
from controller.drivers.openflow import OfRpc, SwitchError
from controller.drivers.tl1 import Tl1Error, Tl1Ocs

LOG = logging.getLogger("optirack.ocs")
DEVICE_ERRORS = (OcsUnavailable, SwitchError, Tl1Error, OSError)


class ReconfigFailed(RuntimeError):
    def __init__(self, event: ReconfigEvent):
        self.event = event
        super().__init__(event.error)


def _pairs(circuits) -> set[tuple[int, int]]:
    return {(a.port, b.port) for a, b in circuits}


class _WhenDark:
    """Runs `work` in its own thread once `count` OCS have reported their old circuits gone."""

    def __init__(self, work, count: int):
        self.work, self.left, self.thread = work, count, None

    def dark(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.thread = hub.spawn(self.work, raise_error=True)

    def join(self) -> None:
        """Wait for the work (run it now if it never started); re-raise its error."""
        if self.thread is None:
            self.work()
        else:
            self.thread.wait()

    def join_quietly(self) -> None:
        if self.thread is not None:
            try:
                self.thread.wait()
            except DEVICE_ERRORS:
                pass


class OcsApp(ConfirmingApp, app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        self.ctx.ocs = self
        self.rpc = OfRpc()
        self.synchronised: set[str] = set()  # OCS whose circuits match ours since they connected
        c = conf()
        self.drivers: dict[str, OcsDriver] = {}
        for spec in self.ctx.rack.spec.ocs:
            if spec.driver == "tl1":
                self.drivers[spec.name] = Tl1Ocs(spec, c.tl1_user, c.tl1_password, sleep=hub.sleep)
            else:
                self.drivers[spec.name] = OpenFlowOcs(spec, self.rpc, c.barrier_timeout, sleep=hub.sleep)
        for name, driver in self.drivers.items():
            if not isinstance(driver, OpenFlowOcs):
                hub.spawn(self._synchronise, name)

    # --- OpenFlow events -------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        kind, name = self.ctx.known.get(ev.datapath.id, (None, None))
        if kind != "ocs" or not isinstance(self.drivers.get(name), OpenFlowOcs):
            return
        if ev.state == MAIN_DISPATCHER:
            self.drivers[name].datapath = ev.datapath
            hub.spawn(self._synchronise, name)
        else:
            self.drivers[name].datapath = None
            self.synchronised.discard(name)
            self.rpc.on_disconnect(ev.datapath.id)




    # --- circuits ------------------------------------------------------------------
    def _synchronise(self, name: str) -> None:
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
            except DEVICE_ERRORS as e:
                LOG.warning("OCS %s: cannot synchronise: %s", name, e)
            self.ctx.adopt_device_circuits = False
        if self.ctx.fabric:
            self.ctx.fabric.sync_quietly()

    def _restore(self, name: str, driver: OcsDriver, device: set[tuple[int, int]]) -> None:
        held = _pairs(self.ctx.circuits.on(name))
        if device == held:
            LOG.info("OCS %s: holds the expected %d circuits", name, len(held))
            return
        ev = self.ctx.events.start("restore", f"OCS {name} connected with other circuits", self.ctx.clock(),
                                   removed=[[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(device - held)],
                                   added=[[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(held - device)])
        driver.replace(held)
        ev.ocs_confirmed_at = ev.flows_confirmed_at = self.ctx.clock()
        ev.status = "ok"
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

    def check_available(self, target: CircuitMap) -> None:
        for ocs in self.ctx.circuits.diff(target).by_ocs():
            if not self.drivers[ocs].connected:
                raise OcsUnavailable(f"OCS {ocs} is not connected")

    def change(self, plan, kind: str, reason: str, job: str | None = None,
               wait: float | None = 0) -> ReconfigEvent | None:
        """Plan and apply under the reconfiguration lock: `plan(current)` returns the target map, or
        None for no change (it may raise to refuse). Minimal stand-in for helper "robust"'s API."""
        if not self.ctx.lock.acquire(blocking=wait != 0, timeout=wait or None):
            raise Busy("another reconfiguration is in progress; try again when it is done")
        try:
            target = plan(self.ctx.circuits)
            if target is None or target == self.ctx.circuits:
                return None
            return self._reconfigure(target, kind, reason, job)
        finally:
            self.ctx.lock.release()

    def reconfigure(self, target: CircuitMap, kind: str, reason: str, job: str | None = None,
                    wait: float | None = 0) -> ReconfigEvent:
        """Apply `target`: OCS diff (confirmed), then forwarding (confirmed). All or nothing."""
        if not self.ctx.lock.acquire(blocking=wait != 0, timeout=wait or None):
            raise Busy("another reconfiguration is in progress; try again when it is done")
        try:
            return self._reconfigure(target, kind, reason, job)
        finally:
            self.ctx.lock.release()

    def _reconfigure(self, target: CircuitMap, kind: str, reason: str, job: str | None) -> ReconfigEvent:
        """Every OCS in the diff at once; the packet switches are re-programmed for `target` while the
        changed circuits are dark (once every OCS confirmed its old circuits gone), so that the
        switches' confirmation overlaps the switching time. All or nothing."""
        ctx = self.ctx
        diff = ctx.circuits.diff(target)
        ev = ctx.events.start(kind, reason, ctx.clock(), job=job,
                              removed=CircuitMap(diff.remove).to_json(), added=CircuitMap(diff.add).to_json())
        previous, parts = ctx.circuits, diff.by_ocs()
        fabric = _WhenDark(lambda: ctx.fabric.sync(target), len(parts))
        try:
            self.check_available(target)
            threads = {ocs: hub.spawn(self.drivers[ocs].apply, _pairs(part.remove), _pairs(part.add), fabric.dark,
                                      raise_error=True) for ocs, part in parts.items()}
            results, errors = [], []
            for thread in threads.values():
                try:
                    results.append(thread.wait())
                except DEVICE_ERRORS as e:
                    errors.append(e)
            if errors:
                fabric.join_quietly()
                raise errors[0]
            ctx.circuits = target
            for result in results:
                ev.switching_time_s = max(ev.switching_time_s, result.switching_time_s)
                ev.dark_start = min(x for x in (ev.dark_start, result.dark_start) if x is not None)
                if result.dark_end is not None:
                    ev.dark_end = max(ev.dark_end or 0.0, result.dark_end)
            ev.ocs_confirmed_at = ctx.clock()
            ctx.save()
            fabric.join()
            ev.flows_confirmed_at = ctx.clock()
            ev.status = "ok"
            LOG.info("reconfiguration %d (%s): -%d +%d circuits, dark %.1f ms, flows confirmed after %.1f ms",
                     ev.id, reason, len(diff.remove), len(diff.add), (ev.dark_window_s or 0) * 1000, ev.total_s * 1000)
            return ev
        except DEVICE_ERRORS as e:
            ev.status, ev.error = "failed", str(e)
            LOG.error("reconfiguration %d (%s) failed: %s; rolling back", ev.id, reason, e)
            self._roll_back(previous, parts)
            raise ReconfigFailed(ev) from None

    def _roll_back(self, previous: CircuitMap, touched) -> None:
        ctx = self.ctx
        for ocs in touched:
            try:
                self.drivers[ocs].replace(_pairs(previous.on(ocs)))
            except DEVICE_ERRORS as e:
                LOG.error("OCS %s: rollback failed (%s); it will be restored when it reconnects", ocs, e)
        ctx.circuits = previous
        ctx.save()
        ctx.fabric.sync_quietly()

    def device_circuits(self) -> dict[str, list[list[str]] | None]:
        """What each OCS reports now (None if it cannot be asked)."""
        result = {}
        for name, driver in self.drivers.items():
            try:
                result[name] = [[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(driver.read())]
            except DEVICE_ERRORS:
                result[name] = None
        return result


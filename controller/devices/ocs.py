"""The OCS keeper: each OCS driven through its driver, kept in step with the circuit map, restored when it
reconnects; it builds the circuit changes (controller/devices/changes.py) over the same drivers.

An OpenFlow OCS connects to us (the OCS app hands its connections in: `connected`, `disconnected`); any other device
is kept by a thread of ours: it logs in, resynchronises, probes, and after a loss retries with backoff.
"""
from __future__ import annotations

import logging

from controller.core.cabling import CircuitError
from controller.core.circuits import CircuitMap
from controller.devices.changes import DEVICE_ERRORS, CircuitChanges, pairs
from controller.drivers import registry
from controller.drivers.ocs import OcsDriver
from controller.drivers.openflow import OfRpc

LOG = logging.getLogger("optirack.ocs")


class OcsDevices:
    def __init__(self, state, fabric, runtime, conf):
        self.state, self.fabric, self.rt = state, fabric, runtime
        self.rpc = OfRpc(self.rt.event)
        c = conf
        self.drivers: dict[str, OcsDriver] = {  # each by the rack file's driver name (controller/drivers/registry.py)
            spec.name: registry.build(spec, c, lock=self.rt.lock, sleep=self.rt.sleep, of_rpc=self.rpc,
                                      barrier_timeout=c.barrier_timeout)
            for spec in self.state.rack.spec.ocs
        }
        self.changes = CircuitChanges(self.state, self.drivers, fabric, self.rt, self._resynchronise_later,
                                      hold_before_confirm=c.fault_hold_confirm)
        self.synchronised = self.changes.synchronised  # OCS whose circuits match ours since they connected
        self.probe_interval, self.retry_max = c.device_probe_interval, c.device_retry_max
        self.keepers: list = []

    def start(self) -> None:
        """Keep every OCS that does not connect to us (TL1, NETCONF) in step, each in a thread of its own."""
        self.keepers = [
            self.rt.spawn(self._keep, name) for name, d in self.drivers.items() if not d.connects_to_controller
        ]

    def connected(self, name: str, dp) -> None:
        """An OpenFlow OCS (re)connected: resynchronise it."""
        if name in self.drivers and self.drivers[name].connects_to_controller:
            self.drivers[name].datapath = dp
            self.rt.spawn(self._synchronise, name)

    def disconnected(self, name: str, dp) -> None:
        if name in self.drivers and self.drivers[name].connects_to_controller:
            self.drivers[name].datapath = None
            self.synchronised.discard(name)
            self.rpc.on_disconnect(dp.id)

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
        if self.state.lock.locked():
            return  # a reconfiguration is changing the devices now; probe next time
        try:
            device = self.drivers[name].read()
        except DEVICE_ERRORS as e:
            LOG.warning("OCS %s: %s", name, e)
            self.synchronised.discard(name)
            return
        if device != pairs(self.state.circuits.on(name)) and not self.state.lock.locked():
            LOG.warning("OCS %s holds other circuits than ours: resynchronising", name)
            self.synchronised.discard(name)

    def _synchronise(self, name: str) -> bool:
        """A (re)connected OCS: adopt its circuits on first contact, else restore the ones we hold."""
        with self.state.lock:
            driver = self.drivers[name]
            try:
                device = driver.read()
                # First contact and no saved state: a device that has circuits is the truth;
                # an empty one (new, or reset) gets the rack file's starting circuits.
                if not (self.state.adopt_device_circuits and device and self._adopt(name, device)):
                    self._restore(name, driver, device)
                self.synchronised.add(name)
                self.state.adopt_device_circuits = False
            except DEVICE_ERRORS as e:
                LOG.warning("OCS %s: cannot synchronise: %s", name, e)
                return False
        self.fabric.sync_quietly()
        return True

    def _restore(self, name: str, driver: OcsDriver, device: set[tuple[int, int]]) -> None:
        held = pairs(self.state.circuits.on(name))
        if device == held:
            LOG.info("OCS %s: holds the expected %d circuits", name, len(held))
            return
        ev = self.state.events.start(
            "restore",
            f"OCS {name} connected with other circuits",
            self.state.clock(),
            removed=[[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(device - held)],
            added=[[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(held - device)],
        )
        try:
            self.state.record_event(ev)
            driver.replace(held)
            ev.ocs_confirmed_at = ev.flows_confirmed_at = self.state.clock()
            ev.status = "ok"
        except Exception as e:
            ev.status, ev.error = "failed", f"{e}"
            raise
        finally:
            self.changes.close(ev)
        self.state.save()
        LOG.info("OCS %s: restored %d circuits", name, len(held))

    def _adopt(self, name: str, device: set[tuple[int, int]]) -> bool:
        others = [[str(a), str(b)] for a, b in self.state.circuits.circuits if a.device != name]
        mine = [[f"{name}:{a}", f"{name}:{b}"] for a, b in sorted(device)]
        try:
            adopted = CircuitMap.parse(self.state.rack, others + mine)
        except CircuitError as e:
            LOG.warning("OCS %s has circuits that do not fit the rack (%s); imposing the rack file's", name, e)
            return False
        self.state.circuits = adopted
        self.state.save()
        LOG.info("OCS %s: adopted its %d circuits", name, len(device))
        return True

    def _resynchronise_later(self, name: str) -> None:
        """An OCS whose state is unknown: its keeper (TL1, NETCONF) or a retrier of ours (OpenFlow) restores it."""
        self.synchronised.discard(name)
        if self.drivers[name].connects_to_controller:
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

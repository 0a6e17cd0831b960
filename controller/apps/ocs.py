"""The OCS app: holds the circuit map, drives each OCS through its driver, restores a reconnected OCS."""
from __future__ import annotations

import logging
from collections.abc import Callable

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
from controller.jobs.errors import ReconfigFailed  # noqa: F401 (the apps' name for it)

LOG = logging.getLogger("optirack.ocs")
DEVICE_ERRORS = (OcsUnavailable, SwitchError, Tl1Error, OSError)


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
        # An OpenFlow OCS connects to us (and again after a loss); any other device is kept by a
        # thread of ours: it logs in, resynchronises, probes, and after a loss retries with backoff.
        self.probe_interval, self.retry_max = c.device_probe_interval, c.device_retry_max
        self.keepers = [
            hub.spawn(self._keep, name) for name, d in self.drivers.items() if not isinstance(d, OpenFlowOcs)
        ]

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
    def _keep(self, name: str, first_retry: float = 0.5) -> None:
        """Keep a device that does not connect to us in step: (re)synchronise it, retried with
        backoff while it is unreachable, then probe it every probe_interval."""
        delay = first_retry
        while True:
            try:
                if name in self.synchronised:
                    hub.sleep(self.probe_interval)
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
                hub.sleep(delay)
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
        if device != _pairs(self.ctx.circuits.on(name)) and not self.ctx.lock.locked():
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
        held = _pairs(self.ctx.circuits.on(name))
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
            self._close(ev)
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

    def change(
        self,
        plan: Callable[[CircuitMap], CircuitMap | None],
        kind: str,
        reason: str | Callable[[], str],
        job: str | None = None,
        wait: float | None = 0,
        note: str | Callable[[], str] = "",
    ) -> ReconfigEvent | None:
        """The one way to change circuits: take the reconfiguration lock, call `plan(current)` under it,
        apply what it returns (OCS diff, then forwarding, both confirmed; all or nothing).

        `plan` sees the map the lock protects and may raise to refuse (Conflict, PlacementError, …):
        preconditions belong in it. None, or a map equal to the current one, changes nothing and
        returns None. `reason` and `note` may be callables, read after `plan` ran. `wait`: seconds to
        wait for the lock (0: refuse at once with Busy; None: wait as long as it takes).
        """
        if not self.ctx.lock.acquire(blocking=wait != 0, timeout=wait or None):
            raise Busy("another reconfiguration is in progress; try again when it is done")
        try:
            target = plan(self.ctx.circuits)
            if target is None or target == self.ctx.circuits:
                return None
            self.check_available(target)
            return self._reconfigure(
                target, kind, reason() if callable(reason) else reason, job, note() if callable(note) else note
            )
        finally:
            self.ctx.lock.release()

    def reconfigure(
        self, target: CircuitMap, kind: str, reason: str, job: str | None = None, wait: float | None = 0
    ) -> ReconfigEvent | None:
        """Make `target` the whole circuit map (for callers whose target does not depend on the
        current map; everyone else plans inside `change`)."""
        return self.change(lambda _current: target, kind, reason, job, wait)

    def _reconfigure(self, target: CircuitMap, kind: str, reason: str, job: str | None, note: str) -> ReconfigEvent:
        ctx = self.ctx
        diff = ctx.circuits.diff(target)
        ev = ctx.events.start(
            kind,
            reason,
            ctx.clock(),
            job=job,
            note=note,
            removed=CircuitMap(diff.remove).to_json(),
            added=CircuitMap(diff.add).to_json(),
        )
        previous, parts = ctx.circuits, diff.by_ocs()

        def program() -> None:  # timed, so that what ran inside the dark window can be told (bench_reconfig)
            ev.fabric_started_at = ctx.clock()
            ctx.fabric.sync(target)
            ev.fabric_confirmed_at = ctx.clock()

        fabric = _WhenDark(program, len(parts))
        try:
            ctx.record_event(ev)
            for result in self._apply_all(parts, fabric):
                ev.switching_time_s = max(ev.switching_time_s, result.switching_time_s)
                ev.dark_start = min(x for x in (ev.dark_start, result.dark_start) if x is not None)
                if result.dark_end is not None:
                    ev.dark_end = max(ev.dark_end or 0.0, result.dark_end)
            ctx.circuits = target
            ev.ocs_confirmed_at = ctx.clock()
            ctx.save(events=[ev])  # the new circuits and the event that made them: one transaction
            fabric.join()
            ev.flows_confirmed_at = ctx.clock()
            ev.status, ev.version = "ok", ctx.circuits_version
            LOG.info(
                "reconfiguration %d (%s): -%d +%d circuits, dark %.1f ms, flows confirmed after %.1f ms",
                ev.id,
                reason,
                len(diff.remove),
                len(diff.add),
                (ev.dark_window_s or 0) * 1000,
                ev.total_s * 1000,
            )
            return ev
        except DEVICE_ERRORS as e:
            self._abandon(ev, str(e), previous, list(diff.by_ocs()))
            raise ReconfigFailed(ev) from None
        except Exception as e:  # a bug: the event still ends, the devices are still put back
            LOG.exception("reconfiguration %d (%s) raised", ev.id, reason)
            self._abandon(ev, f"internal error: {type(e).__name__}: {e}", previous, list(diff.by_ocs()))
            raise
        finally:
            self._close(ev)

    def _apply_all(self, parts, fabric: _WhenDark) -> list:
        """Every OCS of a change at once (their dark windows overlap); the packet switches are
        re-programmed for the target as soon as every changed circuit is dark, so that their
        confirmation overlaps the switching time. Raises the first device error, once all ended."""
        threads = [
            hub.spawn(self.drivers[ocs].apply, _pairs(part.remove), _pairs(part.add), fabric.dark, raise_error=True)
            for ocs, part in parts.items()
        ]
        results, errors = [], []
        for thread in threads:
            try:
                results.append(thread.wait())
            except Exception as e:  # noqa: BLE001 (re-raised below, after every OCS has ended)
                errors.append(e)
        if errors:
            fabric.join_quietly()
            raise errors[0]
        return results

    def _close(self, ev: ReconfigEvent) -> None:
        """No event stays "running": one whose thread was interrupted ends failed; every end is recorded."""
        if ev.status == "running":
            ev.status, ev.error = "failed", ev.error or "interrupted before it finished"
        if ev.version is None:
            ev.version = self.ctx.circuits_version
        self.ctx.record_event(ev)

    def _abandon(self, ev: ReconfigEvent, error: str, previous: CircuitMap, touched: list[str]) -> None:
        ev.status, ev.error = "failed", error
        LOG.error("reconfiguration %d (%s) failed: %s; rolling back", ev.id, ev.reason, error)
        try:
            self._roll_back(previous, touched)
        except Exception:  # noqa: BLE001 (the OCS is restored when it reconnects)
            LOG.exception("reconfiguration %d: rolling back raised", ev.id)

    def _roll_back(self, previous: CircuitMap, touched: list[str]) -> None:
        """Put every OCS the change touched back to `previous`, by difference (circuits it did not
        change stay lit); one that cannot be put back is resynchronised, retried until it is."""
        ctx = self.ctx
        for ocs in touched:
            driver, want = self.drivers[ocs], _pairs(previous.on(ocs))
            try:
                have = driver.read()
                if have != want:
                    driver.apply(have - want, want - have)
            except Exception as e:  # noqa: BLE001 (whatever the driver raised: the others still roll back)
                LOG.error("OCS %s: rollback failed (%s); resynchronising it until it takes", ocs, e)
                self._resynchronise_later(ocs)
        ctx.circuits = previous
        ctx.save()
        ctx.fabric.sync_quietly()

    def _resynchronise_later(self, name: str) -> None:
        """An OCS whose state is unknown: its keeper (TL1) or a retrier of ours (OpenFlow) restores it."""
        self.synchronised.discard(name)
        if isinstance(self.drivers[name], OpenFlowOcs):
            hub.spawn(self._retry_synchronise, name)

    def _retry_synchronise(self, name: str, delay: float = 0.5) -> None:
        while name not in self.synchronised and self.drivers[name].connected:
            hub.sleep(delay)
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

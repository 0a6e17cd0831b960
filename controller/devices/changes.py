"""The circuit-change transaction: the one way circuits change. Under the reconfiguration lock it plans from the
current map, applies the difference on every OCS at once (their dark windows overlap), re-programs the packet
switches for the target as soon as every changed circuit is dark, and records the event; all or nothing: a device
that refuses or fails rolls every OCS it touched back, by difference, and the event ends failed.

It is built by the controller's wiring (controller/apps/context.py) from what it needs: the rack state
(controller/state.py: circuits and their version, the store, the event log, the lock, the clock), one driver per OCS,
the packet switches' keeper (`fabric`: sync, sync_quietly), the runtime, and what to do with an OCS whose state is
unknown after a failed rollback. It is the job service's circuit-change port (controller/jobs/ports.py). Which OCS
hold our circuits (`synchronised`) is kept here, by the OCS keeper (controller/devices/ocs.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controller.core.circuits import CircuitMap
from controller.core.errors import Busy, DeviceError, OcsUnavailable, ReconfigFailed
from controller.core.events import ReconfigEvent

LOG = logging.getLogger("optirack.ocs")
DEVICE_ERRORS = (DeviceError, OSError)


def pairs(circuits) -> set[tuple[int, int]]:
    return {(a.port, b.port) for a, b in circuits}


class _WhenDark:
    """Runs `work` in its own thread once `count` OCS have reported their old circuits gone."""

    def __init__(self, rt, work, count: int):
        self.rt, self.work, self.left, self.thread = rt, work, count, None

    def dark(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.thread = self.rt.spawn(self.work, raise_error=True)

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


class CircuitChanges:
    def __init__(self, state, drivers: dict, fabric, runtime, resynchronise_later: Callable[[str], None]):
        self.state, self.drivers, self.fabric, self.rt = state, drivers, fabric, runtime
        self._resynchronise_later = resynchronise_later  # an OCS whose state is unknown after a failed rollback
        self.synchronised: set[str] = set()  # OCS whose circuits match ours since they connected

    def ready(self) -> bool:
        """Whether every OCS of the rack is connected and holds our circuits."""
        return set(self.synchronised) == set(self.drivers)

    def switching_time_s(self, ocs: str, circuits_made: int) -> float:
        """What OCS `ocs` promises for a change that makes `circuits_made` circuits."""
        return self.drivers[ocs].switching_time_s(circuits_made)

    def check_available(self, target: CircuitMap) -> None:
        for ocs in self.state.circuits.diff(target).by_ocs():
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
        """Take the reconfiguration lock, call `plan(current)` under it, apply what it returns (OCS diff, then
        forwarding, both confirmed; all or nothing).

        `plan` sees the map the lock protects and may raise to refuse (Conflict, PlacementError, …): preconditions
        belong in it. None, or a map equal to the current one, changes nothing and returns None. `reason` and `note`
        may be callables, read after `plan` ran. `wait`: seconds to wait for the lock (0: refuse at once with Busy;
        None: wait as long as it takes).
        """
        if not self.state.lock.acquire(blocking=wait != 0, timeout=wait or None):
            raise Busy("another reconfiguration is in progress; try again when it is done")
        try:
            target = plan(self.state.circuits)
            if target is None or target == self.state.circuits:
                return None
            self.check_available(target)
            return self._reconfigure(
                target, kind, reason() if callable(reason) else reason, job, note() if callable(note) else note
            )
        finally:
            self.state.lock.release()

    def reconfigure(
        self, target: CircuitMap, kind: str, reason: str, job: str | None = None, wait: float | None = 0
    ) -> ReconfigEvent | None:
        """Make `target` the whole circuit map (for callers whose target does not depend on the current map;
        everyone else plans inside `change`)."""
        return self.change(lambda _current: target, kind, reason, job, wait)

    def _reconfigure(self, target: CircuitMap, kind: str, reason: str, job: str | None, note: str) -> ReconfigEvent:
        state = self.state
        diff = state.circuits.diff(target)
        ev = state.events.start(
            kind,
            reason,
            state.clock(),
            job=job,
            note=note,
            removed=CircuitMap(diff.remove).to_json(),
            added=CircuitMap(diff.add).to_json(),
        )
        previous, parts = state.circuits, diff.by_ocs()

        def program() -> None:  # timed, so that what ran inside the dark window can be told (bench_reconfig)
            ev.fabric_started_at = state.clock()
            self.fabric.sync(target)
            ev.fabric_confirmed_at = state.clock()

        fabric = _WhenDark(self.rt, program, len(parts))
        try:
            state.record_event(ev)
            for result in self._apply_all(parts, fabric):
                ev.switching_time_s = max(ev.switching_time_s, result.switching_time_s)
                ev.dark_start = min(x for x in (ev.dark_start, result.dark_start) if x is not None)
                if result.dark_end is not None:
                    ev.dark_end = max(ev.dark_end or 0.0, result.dark_end)
            state.circuits = target
            ev.ocs_confirmed_at = state.clock()
            state.save(events=[ev])  # the new circuits and the event that made them: one transaction
            fabric.join()
            ev.flows_confirmed_at = state.clock()
            ev.status, ev.version = "ok", state.circuits_version
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
            self.close(ev)

    def _apply_all(self, parts, fabric: _WhenDark) -> list:
        """Every OCS of a change at once (their dark windows overlap); the packet switches are re-programmed for the
        target as soon as every changed circuit is dark, so that their confirmation overlaps the switching time.
        Raises the first device error, once all ended."""
        threads = [
            self.rt.spawn(
                self.drivers[ocs].apply, pairs(part.remove), pairs(part.add), fabric.dark, raise_error=True
            )
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

    def close(self, ev: ReconfigEvent) -> None:
        """No event stays "running": one whose thread was interrupted ends failed; every end is recorded."""
        if ev.status == "running":
            ev.status, ev.error = "failed", ev.error or "interrupted before it finished"
        if ev.version is None:
            ev.version = self.state.circuits_version
        self.state.record_event(ev)

    def _abandon(self, ev: ReconfigEvent, error: str, previous: CircuitMap, touched: list[str]) -> None:
        ev.status, ev.error = "failed", error
        LOG.error("reconfiguration %d (%s) failed: %s; rolling back", ev.id, ev.reason, error)
        try:
            self._roll_back(previous, touched)
        except Exception:  # noqa: BLE001 (the OCS is restored when it reconnects)
            LOG.exception("reconfiguration %d: rolling back raised", ev.id)

    def _roll_back(self, previous: CircuitMap, touched: list[str]) -> None:
        """Put every OCS the change touched back to `previous`, by difference (circuits it did not change stay lit);
        one that cannot be put back is resynchronised, retried until it is."""
        state = self.state
        for ocs in touched:
            driver, want = self.drivers[ocs], pairs(previous.on(ocs))
            try:
                have = driver.read()
                if have != want:
                    driver.apply(have - want, want - have)
            except Exception as e:  # noqa: BLE001 (whatever the driver raised: the others still roll back)
                LOG.error("OCS %s: rollback failed (%s); resynchronising it until it takes", ocs, e)
                self._resynchronise_later(ocs)
        state.circuits = previous
        state.save()
        self.fabric.sync_quietly()

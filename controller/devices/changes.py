"""The circuit-change transaction: the one way circuits change. Under the reconfiguration lock it plans from the
current map, applies the difference on every OCS at once (their dark windows overlap) while the packet switches get the
target's new entries (harmless while the changed circuits are dark), removes the entries that left once the OCS
confirmed, and records the event; all or nothing: a device
that refuses or fails rolls every OCS it touched back, by difference, and the event ends failed.

It is built by the controller's wiring (controller/apps/context.py) from what it needs: the rack state
(controller/state.py: circuits and their version, the store, the event log, the lock, the clock), one driver per OCS,
the packet switches' keeper (`fabric`: add_new, remove_left, sync_quietly), the runtime, and what to do with an OCS
whose state is unknown after a failed rollback. It is the job service's circuit-change port (controller/jobs/ports.py).
Which OCS hold our circuits (`synchronised`) is kept here, by the OCS keeper (controller/devices/ocs.py).
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


def _outcome(fn, *args):
    """(result, None) or (None, the exception): a thread's error goes to whoever waits for it, not to the log."""
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 (handed to the waiter, which raises it)
        return None, e


class _WhenDark:
    """Runs `work(plan)` in its own thread once `count` OCS have reported their old circuits gone and the plan is
    ready (whichever comes last); an error goes to `join`."""

    def __init__(self, rt, work, count: int):
        self.rt, self.work, self.left, self.plan, self.thread = rt, work, count, None, None

    def dark(self) -> None:
        self.left -= 1
        self._start()

    def ready(self, plan) -> None:
        self.plan = plan
        self._start()

    def _start(self) -> None:
        if self.left <= 0 and self.plan is not None and self.thread is None:
            self.thread = self.rt.spawn(_outcome, self.work, self.plan)

    def join(self) -> None:
        """Wait for the work (run it now if it never started); re-raise its error."""
        if self.thread is None:
            self.work(self.plan)
            return
        _, error = self.thread.wait()
        if error is not None:
            raise error


def _join_quietly(fabric) -> None:
    """Wait for the switches' programming of a change that failed (its rollback re-programs them)."""
    if fabric is not None and fabric.thread is not None:
        fabric.thread.wait()  # an _outcome: never raises


class CircuitChanges:
    def __init__(self, state, drivers: dict, fabric, runtime, resynchronise_later: Callable[[str], None],
                 hold_before_confirm: bool = False):
        self.state, self.drivers, self.fabric, self.rt = state, drivers, fabric, runtime
        self.hold_before_confirm = hold_before_confirm  # a fault hook for tests (--optirack-fault-hold-confirm)
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

        def program(plan) -> None:  # timed, so that what ran inside the dark window can be told (bench_reconfig)
            ev.fabric_started_at = state.clock()
            self.fabric.add_new(plan)
            ev.fabric_confirmed_at = state.clock()

        fabric = _WhenDark(self.rt, program, len(parts))
        joined = False
        try:
            state.record_event(ev)
            # Every OCS starts (its old circuits go dark); meanwhile the switches' new entries are computed and
            # encoded, so that once every changed circuit is dark they go out at once, each switch in one bundle,
            # while the OCS switches; the entries of addresses that left go once the OCS confirmed.
            ocs = self._start_all(parts, fabric.dark)
            self.rt.sleep(0)  # the OCS threads send their teardown first: the plan is computed while the OCS works
            fabric.ready(self.fabric.prepare(target))
            for result in self._wait_all(ocs):
                ev.switching_time_s = max(ev.switching_time_s, result.switching_time_s)
                ev.dark_start = min(x for x in (ev.dark_start, result.dark_start) if x is not None)
                if result.dark_end is not None:
                    ev.dark_end = max(ev.dark_end or 0.0, result.dark_end)
            self._confirm_all(parts)  # every OCS read its change back: now each may keep it
            state.circuits = target
            ev.ocs_confirmed_at = state.clock()
            state.save(events=[ev])  # the new circuits and the event that made them: one transaction
            fabric.join()
            joined = True
            if self.fabric.remove_left():  # the entries of addresses that left
                ev.fabric_confirmed_at = state.clock()
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
            _join_quietly(None if joined else fabric)
            self._abandon(ev, str(e), previous, list(diff.by_ocs()))
            raise ReconfigFailed(ev) from None
        except Exception as e:  # a bug: the event still ends, the devices are still put back
            LOG.exception("reconfiguration %d (%s) raised", ev.id, reason)
            _join_quietly(None if joined else fabric)
            self._abandon(ev, f"internal error: {type(e).__name__}: {e}", previous, list(diff.by_ocs()))
            raise
        finally:
            self.close(ev)

    def _start_all(self, parts, on_dark) -> list:
        """Every OCS of a change at once (their dark windows overlap)."""
        return [
            self.rt.spawn(_outcome, self.drivers[ocs].apply, pairs(part.remove), pairs(part.add), on_dark)
            for ocs, part in parts.items()
        ]

    def _confirm_all(self, parts) -> None:
        """Confirm each OCS's change (a NETCONF OCS undoes an unconfirmed one by itself), once all were read back."""
        if self.hold_before_confirm:
            LOG.warning("a change of circuits held before its confirm by --optirack-fault-hold-confirm")
            while True:
                self.rt.sleep(3600)
        for ocs in parts:
            self.drivers[ocs].confirm()

    @staticmethod
    def _wait_all(threads) -> list:
        """The OCS changes' results; raises the first device error, once all ended."""
        outcomes = [thread.wait() for thread in threads]
        for _, error in outcomes:
            if error is not None:
                raise error
        return [result for result, _ in outcomes]

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
                driver.cancel()  # an unconfirmed change: the device undoes it itself
                have = driver.read()
                if have != want:
                    driver.apply(have - want, want - have)
                    driver.confirm()  # a rollback is a change too: unconfirmed, the switch would undo it by itself
            except Exception as e:  # noqa: BLE001 (whatever the driver raised: the others still roll back)
                LOG.error("OCS %s: rollback failed (%s); resynchronising it until it takes", ocs, e)
                self._resynchronise_later(ocs)
        state.circuits = previous
        state.save()
        self.fabric.sync_quietly()

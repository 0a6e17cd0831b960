"""The packet switches' keeper: proactive forwarding, each switch's table made equal to what
`controller.core.forwarding` says for the circuit map, confirmed by barrier, resynchronised on reconnect.

No flooding and no learning. The fabric app (controller/apps/fabric.py) hands it the switches that connect and go, and
the replies; the circuit changes (controller/devices/changes.py) call `sync` inside each change's dark window.
"""
from __future__ import annotations

import logging
from collections import defaultdict

from controller.core.forwarding import Table, compute_tables
from controller.drivers import openflow as of

LOG = logging.getLogger("optirack.fabric")


def table_changes(installed: Table, desired: Table) -> list[bytes]:
    """Flow-mods that turn `installed` into `desired`: deletions for addresses that leave, and adds
    (which replace a rule with the same match) for those that are new or move."""
    msgs = []
    for ip in installed:
        if ip not in desired:
            msgs += of.forward_delete(ip)
    for ip, port in desired.items():
        if installed.get(ip) != port:
            msgs += of.forward_add(ip, port)
    return msgs


class Fabric:
    def __init__(self, state, runtime, timeout: float):
        self.state, self.rt, self.timeout = state, runtime, timeout
        self.rpc = of.OfRpc(self.rt.event)
        self.installed: dict[str, Table] = {}  # confirmed tables of connected switches
        self.dps: dict[str, object] = {}
        self._locks = defaultdict(self.rt.lock)

    def connected(self, name: str, dp) -> None:
        """Switch `name` (re)connected: its full table, in the background."""
        self.dps[name] = dp
        self.rt.spawn(self._resync_quietly, name)

    def disconnected(self, name: str, dp) -> None:
        if self.dps.get(name) is dp:
            del self.dps[name]
            self.installed.pop(name, None)
            self.rpc.on_disconnect(dp.id)

    def desired(self, circuits=None) -> dict[str, Table]:
        return compute_tables(self.state.rack, self.state.circuits if circuits is None else circuits)

    def resync(self, name: str) -> None:
        """Delete every flow of a (re)connected switch and install its full table."""
        with self._locks[name]:
            dp = self.dps.get(name)
            if dp is None:
                return
            table = self.desired()[name]
            msgs = [of.delete_all()] + [m for ip, port in sorted(table.items()) for m in of.forward_add(ip, port)]
            self.installed.pop(name, None)
            self.rpc.confirm(dp, msgs, self.timeout, f"the table of {name}")
            self.installed[name] = table
            LOG.info("switch %s: installed %d forwarding entries", name, len(table))

    def _resync_quietly(self, name: str) -> None:
        try:
            self.resync(name)
        except of.SwitchError as e:
            LOG.warning("switch %s: resynchronisation failed: %s", name, e)

    def sync(self, circuits=None) -> None:
        """Bring every connected switch to the tables of `circuits` (default: the current map), all
        switches at once, each in one bundle; returns once all confirmed."""
        desired = self.desired(circuits)
        names = sorted(self.dps)
        for name in names:
            self._locks[name].acquire()
        try:
            batches, tables, ids = [], {}, {}
            for name in names:
                dp = self.dps.get(name)
                if dp is None or name not in self.installed:
                    continue  # (re)connecting: its resync installs the full table
                msgs = table_changes(self.installed[name], desired[name])
                if msgs:
                    batches.append((dp, msgs, f"forwarding on {name}"))
                tables[name], ids[name] = desired[name], dp.id
            try:
                if batches:
                    self.rpc.confirm_all(batches, self.timeout)
            except of.SwitchError as e:
                failed = [n for n in tables if ids[n] in e.datapaths]
                for name in failed:  # what a switch that failed holds is unknown now: its full table, retried
                    self.installed.pop(name, None)
                    tables.pop(name)
                    self.rt.spawn(self._resync_until_done, name)
                raise
            finally:
                self.installed.update(tables)
        finally:
            for name in names:
                self._locks[name].release()

    def _resync_until_done(self, name: str, delay: float = 0.5, most: float = 30.0) -> None:
        """Retry a full resync of a switch that did not confirm, with backoff, while it stays connected."""
        while name in self.dps and name not in self.installed:
            self.rt.sleep(delay)
            try:
                self.resync(name)
            except of.SwitchError as e:
                delay = min(delay * 2, most)
                LOG.warning("switch %s: resynchronisation failed (%s); next try in %.1f s", name, e, delay)

    def sync_quietly(self) -> None:
        try:
            self.sync()
        except of.SwitchError as e:
            LOG.warning("forwarding sync failed: %s", e)

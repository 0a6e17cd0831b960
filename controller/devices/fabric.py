"""The packet switches' keeper: proactive forwarding, each switch's table made equal to what
`controller.core.forwarding` says for the circuit map, confirmed by barrier, resynchronised on reconnect.

No flooding and no learning. The fabric app (controller/apps/fabric.py) hands it the switches that connect and go, and
the replies; each circuit change (controller/devices/changes.py) calls `prepare` while its OCS tears down, `add_new`
once the changed circuits are dark, and `remove_left` once the OCS confirmed.
"""
from __future__ import annotations

import ipaddress
import logging
import struct
from collections import defaultdict
from typing import Any

from containers import aggproto
from controller.core import aggregators
from controller.core.forwarding import Table
from controller.core.rack import Rack
from controller.drivers import openflow as of

LOG = logging.getLogger("optirack.fabric")


def table_changes(installed: Table, desired: Table) -> list[bytes]:
    """Flow-mods that turn `installed` into `desired`: deletions for addresses that leave, and adds
    (which replace a rule with the same match) for those that are new or move."""
    msgs: list[bytes] = []
    for ip in installed:
        if ip not in desired:
            msgs += of.forward_delete(ip)
    for ip, port in desired.items():
        if installed.get(ip) != port:
            msgs += of.forward_add(ip, port)
    return msgs


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def end_frame(rack: Rack, a: aggregators.Aggregator, key: int) -> bytes:
    """The Ethernet frame that tells aggregator `a` the job of `key` at it is over (aggproto END: its slots freed
    now): UDP to the aggregator's address and port, from the rack network's own address (its subnet's first, no
    NIC's), to the broadcast MAC (the controller does not know the aggregator's; the frame goes out of the
    aggregator's port only). No UDP checksum (none is needed over IPv4)."""
    payload = aggproto.pack(aggproto.END, key)
    udp = struct.pack("!HHHH", a.udp_port, a.udp_port, 8 + len(payload), 0) + payload
    src = rack.spec.network.subnet.network_address.packed
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0, src,
                     ipaddress.IPv4Address(a.ip).packed)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return b"\xff" * 6 + bytes.fromhex("020000000001") + b"\x08\x00" + ip + udp


class Fabric:
    def __init__(self, state, runtime, timeout: float):
        self.state, self.rt, self.timeout = state, runtime, timeout
        self.rpc = of.OfRpc(self.rt.event)
        self.installed: dict[str, Table] = {}  # confirmed tables of connected switches
        self._left: dict[str, set[str]] = {}  # addresses add_new kept for remove_left
        self.dps: dict[str, Any] = {}  # connected switches: name -> Ryu's Datapath
        self._locks: defaultdict[str, Any] = defaultdict(self.rt.lock)

    def connected(self, name: str, dp) -> None:
        """Switch `name` (re)connected: its full table, in the background."""
        self.dps[name] = dp
        self.rt.spawn(self._resync_quietly, name)

    def disconnected(self, name: str, dp: Any) -> None:
        current = self.dps.get(name)
        if current is not None and current is dp:
            del self.dps[name]
            self.installed.pop(name, None)
            self.rpc.on_disconnect(current.id)

    def end_aggregation(self, switch: str, key: int) -> bool:
        """Tell `switch`'s aggregator that the job of `key` there is over, so that it frees the job's slots now rather
        than once they have been idle for its idle time: one END datagram out of the aggregator's port (a
        packet-out). Whether it went (not where the switch has no aggregator or is not connected)."""
        a = next((a for a in aggregators.aggregators(self.state.rack) if a.switch == switch), None)
        dp = self.dps.get(switch)
        if a is None or dp is None:
            LOG.warning("cannot tell %s's aggregator that job key %d ended: %s", switch, key,
                        "it has none" if a is None else "the switch is not connected")
            return False
        o, p = dp.ofproto, dp.ofproto_parser
        msg = p.OFPPacketOut(datapath=dp, buffer_id=o.OFP_NO_BUFFER, in_port=o.OFPP_CONTROLLER,
                             actions=[p.OFPActionOutput(a.port)], data=end_frame(self.state.rack, a, key))
        return bool(dp.send_msg(msg))

    def desired(self, circuits=None) -> dict[str, Table]:
        return aggregators.tables(self.state.rack, self.state.circuits if circuits is None else circuits)

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
        self._sync(self.desired(circuits), keep=False)

    def prepare(self, circuits) -> tuple[dict[str, Table], dict]:
        """What `add_new` sends for `circuits`, computed and encoded now (no I/O): the target tables, and per switch
        the installed table it was computed against, the table to install and its flow-mods."""
        desired = self.desired(circuits)
        self._left = {name: set(table) - set(desired[name]) for name, table in self.installed.items()}
        plan = {}
        for name, table in list(self.installed.items()):
            want = {**table, **desired[name]}
            plan[name] = (table, want, table_changes(table, want))
        return desired, plan

    def add_new(self, prepared) -> None:
        """Only the entries a change adds or moves (`prepare`'s), every installed one kept, all switches at once, each
        in one bundle; `remove_left` then removes the entries of addresses that leave. A circuit change sends these
        once its changed circuits are dark, before the OCS makes the new ones."""
        desired, plan = prepared
        self._sync(desired, keep=True, prepared=plan)

    def remove_left(self) -> bool:
        """After `add_new`: delete the entries of the addresses that left (usually none: every switch has an entry
        for every NIC with a circuit). True if there were some."""
        left, self._left = self._left, {}
        names = sorted(n for n, ips in left.items() if ips and n in self.dps and n in self.installed)
        if names:
            kept = {n: {ip: port for ip, port in self.installed[n].items() if ip not in left[n]} for n in names}
            self._sync({**self.installed, **kept}, keep=False, only=names)
        return bool(names)

    def _sync(self, desired: dict[str, Table], keep: bool, only: list[str] | None = None,
              prepared: dict | None = None) -> None:
        names = sorted(self.dps) if only is None else only
        for name in names:
            self._locks[name].acquire()
        try:
            batches, tables, ids = [], {}, {}
            for name in names:
                dp = self.dps.get(name)
                if dp is None or name not in self.installed:
                    continue  # (re)connecting: its resync installs the full table
                if prepared and name in prepared and prepared[name][0] is self.installed[name]:
                    want, msgs = prepared[name][1:]
                else:  # a switch resynchronised since: against what it holds now
                    want = {**self.installed[name], **desired[name]} if keep else desired[name]
                    msgs = table_changes(self.installed[name], want)
                if msgs:
                    batches.append((dp, msgs, f"forwarding on {name}"))
                tables[name], ids[name] = want, dp.id
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

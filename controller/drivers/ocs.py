"""OCS drivers: one small interface (read circuits, apply a diff, switching time) and the
emulated OCS over OpenFlow. The TL1 driver for Calient/Polatis-style switches is in `tl1`, the
NETCONF one (Polatis's YANG structure) in `netconf`.

Circuits at this level are port-number pairs ``(a, b)`` with ``a < b`` on one device: the cross-connect
objects of the OCP SAI OCS API, whose bulk remove and bulk create `apply` is, in one transaction of the
device (docs/netconf-ocs.md maps the two and says what a SONiC-OCS driver still needs).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from controller.core.errors import OcsUnavailable  # noqa: F401 (the drivers' name for it)
from controller.core.rack import Ocs
from controller.drivers import openflow as of

Pair = tuple[int, int]


@dataclass(frozen=True)
class ApplyResult:
    dark_start: float | None  # wall clock: old circuits gone
    dark_end: float | None  # wall clock: new circuits confirmed
    switching_time_s: float  # what the model or the device promises for this change


class OcsDriver(ABC):
    """What the OCS app needs of a device."""

    def __init__(self, spec: Ocs, clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        self.spec, self.clock, self.sleep = spec, clock, sleep
        self.last_seen: float | None = None  # when the device last answered
        self.last_error: str | None = None  # why it last failed to, if it did since

    def seen(self) -> None:
        self.last_seen, self.last_error = self.clock(), None

    def status(self) -> dict:
        """What is known of the device without asking it (for status reads: no I/O here)."""
        return {"connected": self.connected, "last_seen": self.last_seen, "error": self.last_error}

    def switching_time_s(self, circuits_made: int) -> float:
        """One new circuit takes the per-connection time; several are set up in parallel in the bulk time."""
        if circuits_made == 0:
            return 0.0
        ms = self.spec.switching_time_ms if circuits_made == 1 else self.spec.bulk_time_ms
        return ms / 1000.0

    @property
    @abstractmethod
    def connected(self) -> bool:
        """The last known state of the session; never opens one (status reads must stay fast)."""

    @abstractmethod
    def read(self) -> set[Pair]:
        """The circuits the device has now."""

    @abstractmethod
    def apply(self, remove: set[Pair], add: set[Pair], on_dark: Callable[[], None] | None = None) -> ApplyResult:
        """Tear down `remove`, make `add`; return once the device confirms. Other circuits are untouched.
        `on_dark` is called once the old circuits are gone (the caller may re-program switches meanwhile)."""

    @abstractmethod
    def replace(self, circuits: set[Pair]) -> None:
        """Make the device hold exactly `circuits` (restoring a device that lost its state)."""


def _both_ways(pairs: set[Pair]) -> list[bytes]:
    """The flow-mods that make circuits: in_port=a -> b and in_port=b -> a."""
    return [m for a, b in sorted(pairs) for m in (of.circuit_add(a, b), of.circuit_add(b, a))]


class OpenFlowOcs(OcsDriver):
    """The emulated OCS: an OVS bridge whose flows are circuits, changed with a modelled MEMS delay.

    The circuits being changed go dark (their flows are removed in one bundle, confirmed), stay
    dark for the switching time while the mirrors would move, then the new circuits' flows are
    committed in one bundle and confirmed. The new flows are sent and checked by the switch
    during the dark window, so only the commit remains when the switching time is over.
    """

    def __init__(self, spec: Ocs, rpc: of.OfRpc, timeout: float, **kw):
        super().__init__(spec, **kw)
        self.rpc, self.timeout = rpc, timeout
        self.datapath = None  # set by the OCS app while the bridge is connected
        self._other_cookies: set[int] = set()  # in_ports whose flow read() found without its per-port cookie

    @property
    def connected(self) -> bool:
        return self.datapath is not None

    def _dp(self):
        if self.datapath is None:
            raise OcsUnavailable(f"OCS {self.spec.name} (datapath {self.spec.dpid:#x}) is not connected")
        return self.datapath

    def read(self) -> set[Pair]:
        flows = self.rpc.request(
            self._dp(), of.flow_stats_request(of.OCS_COOKIE, of.OCS_TAG_MASK), self.timeout, "a flow dump"
        )
        pairs, others = set(), set()
        for f in flows:
            in_port = f.match.get("in_port")
            outs = [a.port for i in f.instructions for a in getattr(i, "actions", []) if hasattr(a, "port")]
            if in_port is not None and len(outs) == 1:
                pairs.add((in_port, outs[0]))
                if f.cookie != of.circuit_cookie(in_port):
                    others.add(in_port)
        self._other_cookies = others  # (a block delete by cookie would miss these: they go one by one)
        self.seen()
        return {(min(a, b), max(a, b)) for a, b in pairs if (b, a) in pairs}

    def apply(self, remove: set[Pair], add: set[Pair], on_dark: Callable[[], None] | None = None) -> ApplyResult:
        dp = self._dp()
        switching = self.switching_time_s(len(add))
        gone = {p for pair in remove for p in pair} | {p for pair in add for p in pair}
        odd = gone & self._other_cookies  # by cookie in aligned blocks of ports, a flow of another cookie alone
        msgs = [of.circuit_delete_block(*b) for b in of.port_blocks(gone - odd)] + [of.circuit_delete(p) for p in odd]
        self.rpc.confirm(dp, msgs, self.timeout, "removing circuits")
        self._other_cookies -= gone
        dark_start = self.clock()
        if not add:
            if on_dark is not None:
                on_dark()
            return ApplyResult(dark_start, None, 0.0)
        batch = self.rpc.stage(dp, _both_ways(add), "new circuits")
        if on_dark is not None:
            on_dark()
        self.rpc.wait_staged(batch, self.timeout)
        self.sleep(max(0.0, switching - (self.clock() - dark_start)))  # the mirrors settle
        self.rpc.commit(batch)
        self.rpc.wait_committed(batch, self.timeout)
        self.seen()
        return ApplyResult(dark_start, self.clock(), switching)

    def replace(self, circuits: set[Pair]) -> None:
        self.rpc.confirm(self._dp(), [of.delete_all(), *_both_ways(circuits)], self.timeout, "restoring circuits")
        self._other_cookies = set()
        self.seen()

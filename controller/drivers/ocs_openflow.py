"""The emulated OCS over OpenFlow: an Open vSwitch bridge whose flows are circuits, connected to the controller.

Its OpenFlow messages (controller.drivers.openflow, on Ryu) are imported when the driver first sends one, so that
declaring the driver (`DRIVER`, read by the rack file's schema through the registry) needs no Ryu.
"""
from __future__ import annotations

from collections.abc import Callable

from controller.core.errors import OcsUnavailable
from controller.core.rack import Ocs
from controller.drivers.ocs import ApplyResult, OcsDriver, Pair
from controller.drivers.registry import DriverKind


def _of():
    from controller.drivers import openflow

    return openflow


def _both_ways(pairs: set[Pair]) -> list[bytes]:
    """The flow-mods that make circuits: in_port=a -> b and in_port=b -> a."""
    of = _of()
    return [m for a, b in sorted(pairs) for m in (of.circuit_add(a, b), of.circuit_add(b, a))]


class OpenFlowOcs(OcsDriver):
    """The emulated OCS: an OVS bridge whose flows are circuits, changed with a modelled MEMS delay.

    The circuits being changed go dark (their flows are removed in one bundle, confirmed), stay
    dark for the switching time while the mirrors would move, then the new circuits' flows are
    committed in one bundle and confirmed. The new flows are sent and checked by the switch
    during the dark window, so only the commit remains when the switching time is over.
    """

    connects_to_controller = True

    def __init__(self, spec: Ocs, rpc, timeout: float, **kw):
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
        of = _of()
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
        dp, of = self._dp(), _of()
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
        self.rpc.confirm(self._dp(), [_of().delete_all(), *_both_ways(circuits)], self.timeout, "restoring circuits")
        self._other_cookies = set()
        self.seen()


DRIVER = DriverKind(
    "openflow",
    "the emulated OCS: an Open vSwitch bridge whose flows are circuits; it connects to the controller (its dpid)",
    address=None,
    build=lambda spec, w: OpenFlowOcs(spec, w.of_rpc, w.barrier_timeout, sleep=w.sleep),
)

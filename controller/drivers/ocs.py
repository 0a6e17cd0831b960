"""OCS drivers: one small interface (read circuits, apply a diff, confirm it, switching time). The drivers, by name
(`registry`): the emulated OCS over OpenFlow in `ocs_openflow`, TL1 for Calient/Polatis-style switches in `tl1`,
NETCONF (Polatis's YANG structure) in `netconf`.

Circuits at this level are port-number pairs ``(a, b)`` with ``a < b`` on one device: the cross-connect
objects of the OCP SAI OCS API, whose bulk remove and bulk create `apply` is, in one transaction of the
device (docs/netconf-ocs.md maps the two and says what a SONiC-OCS driver still needs).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.core.rack import Ocs

Pair = tuple[int, int]


@dataclass(frozen=True)
class ApplyResult:
    dark_start: float | None  # wall clock: old circuits gone
    dark_end: float | None  # wall clock: new circuits confirmed
    switching_time_s: float  # what the model or the device promises for this change


class OcsDriver(ABC):
    """What the OCS app needs of a device."""

    connects_to_controller = False  # True: the device connects to us (OpenFlow); else a keeper of ours reaches it
    datapath: Any = None  # a device that connects to us: its connection, set by the OCS app while it is up

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

    def confirm(self) -> None:
        """Keep the change `apply` made. A device that undoes a change by itself unless it is confirmed (NETCONF's
        confirmed commit) holds it only until this; the change's caller confirms once every OCS of the change has
        read its change back. Others: nothing to do."""
        return None

    def cancel(self) -> bool:
        """Undo an unconfirmed change at once (the device's own rollback); False if there is none to undo."""
        return False

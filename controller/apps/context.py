"""The state the optirack apps share: one object per ryu-manager, handed to each app as a Ryu context."""
from __future__ import annotations

import logging
import sys

from controller.config import conf
from controller.core.rack import Rack, RackError, load_rack

LOG = logging.getLogger("optirack")


class Optirack:
    """The rack being controlled and what is known of its datapaths."""

    def __init__(self, rack: Rack | None = None):
        if rack is None:
            try:
                rack = load_rack(conf().rack)
            except RackError as e:
                LOG.error("cannot start: %s", e)
                sys.exit(2)
        self.rack = rack
        self.known = rack.datapaths()  # dpid -> ("ocs" | "switch", name)
        self.datapaths: dict[int, object] = {}  # connected ones, dpid -> ryu Datapath

    def name_of(self, dpid: int) -> str:
        kind, name = self.known.get(dpid, ("unknown", f"{dpid:#x}"))
        return name if kind != "unknown" else f"unknown datapath {name}"

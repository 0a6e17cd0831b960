"""Keeps track of which of the rack's datapaths are connected, and refuses strangers."""
from __future__ import annotations

import logging

from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.ofproto import ofproto_v1_3

from controller.apps.context import Optirack

LOG = logging.getLogger("optirack.inventory")


class Inventory(app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        LOG.info("%s", self.ctx.rack.summary())

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        dp = ev.datapath
        if dp.id is None:
            return
        if ev.state == MAIN_DISPATCHER:
            if dp.id not in self.ctx.known:
                LOG.warning("datapath %#x is not in rack %s; ignoring it", dp.id, self.ctx.rack.name)
                return
            self.ctx.datapaths[dp.id] = dp
            LOG.info("datapath %#x (%s) connected, OpenFlow 1.3", dp.id, self.ctx.name_of(dp.id))
        elif self.ctx.datapaths.get(dp.id) is dp:
            del self.ctx.datapaths[dp.id]
            LOG.info("datapath %#x (%s) disconnected", dp.id, self.ctx.name_of(dp.id))

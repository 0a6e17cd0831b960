"""Event handlers that feed an app's `OfRpc` with the replies and errors its requests caused."""
from __future__ import annotations

import logging

from ryu.controller import ofp_event
from ryu.controller.handler import MAIN_DISPATCHER, set_ev_cls

LOG = logging.getLogger("optirack.openflow")


class ConfirmingApp:
    """Mix into a RyuApp that has `self.rpc` (an OfRpc) and `self.ctx` (the Optirack context)."""

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev):
        self.rpc.on_barrier_reply(ev.msg)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats_reply(self, ev):
        self.rpc.on_multipart_reply(ev.msg)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, MAIN_DISPATCHER)
    def _error(self, ev):
        if self.rpc.on_error(ev.msg):
            LOG.warning("%s refused a message: type %s code %s", self.ctx.name_of(ev.msg.datapath.id),
                        ev.msg.type, ev.msg.code)

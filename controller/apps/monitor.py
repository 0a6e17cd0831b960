"""The monitor app: polls port statistics of every datapath and keeps a throughput history per port."""
from __future__ import annotations

import logging

from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.ofproto import ofproto_v1_3

from controller.apps.context import Optirack
from controller.config import conf
from controller.drivers import openflow as of

LOG = logging.getLogger("optirack.monitor")
MAX_PORT = 0xFFFFFF00  # above are reserved ports (LOCAL, …)


class MonitorApp(app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        self.interval = conf().monitor_interval
        self.polls = 0
        self._thread = self.ctx.rt.spawn(self._poll)

    def _poll(self) -> None:
        while True:
            for dp in list(self.ctx.datapaths.values()):
                msg = of.port_stats_request()
                msg.datapath = dp
                dp.send_msg(msg)
            self.polls += 1
            self.ctx.rt.sleep(self.interval)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev):
        now = self.ctx.clock()
        dpid = ev.msg.datapath.id
        for s in ev.msg.body:
            if s.port_no < MAX_PORT:
                self.ctx.ports.record(dpid, s.port_no, now, s.rx_bytes, s.tx_bytes)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _gone(self, ev):
        if ev.datapath.id is not None:
            self.ctx.ports.forget(ev.datapath.id)

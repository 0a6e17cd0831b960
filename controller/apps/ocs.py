"""The OCS app: hands the OpenFlow OCS that connect and go, their replies, and their ports' link changes to the parts
the controller's wiring (controller/apps/context.py) built: the OCS keeper (controller/devices/ocs.py) and the job
service (a GPU's NIC whose link drops is lost to its job: controller/jobs/recovery.py)."""
from __future__ import annotations

import logging

from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.ofproto import ofproto_v1_3

from controller.apps.confirm import ConfirmingApp
from controller.apps.context import Optirack
from controller.core.rack import PortRef
from controller.devices.ocs import OcsDevices

LOG = logging.getLogger("optirack.ocs")


class OcsApp(ConfirmingApp, app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        self.devices: OcsDevices = self.ctx.ocs
        self.rpc = self.devices.rpc
        self.jobs = self.ctx.jobs
        self.devices.start()

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        kind, name = self.ctx.known.get(ev.datapath.id, (None, None))
        if kind != "ocs":
            return
        if ev.state == MAIN_DISPATCHER:
            self.devices.connected(name, ev.datapath)
        else:
            self.devices.disconnected(name, ev.datapath)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev):
        """A port of an OCS changed: a GPU's NIC whose link drops is lost to its job (controller/jobs/recovery.py)."""
        kind, name = self.ctx.known.get(ev.msg.datapath.id, (None, None))
        if kind != "ocs":
            return
        desc, ofp = ev.msg.desc, ofproto_v1_3
        up = not (desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)
        LOG.info("OCS %s port %s: link %s", name, desc.port_no, "up" if up else "down")
        self.jobs.link_changed(PortRef(name, desc.port_no), up)

    def __getattr__(self, name: str):
        """What the app lacks is the keeper's (tests hold the app)."""
        if name == "devices":
            raise AttributeError(name)
        return getattr(self.devices, name)

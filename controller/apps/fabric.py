"""The fabric app: hands the packet switches that connect and go, and their replies, to the switches' keeper
(controller/devices/fabric.py), which the controller's wiring (controller/apps/context.py) built."""
from __future__ import annotations

from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.ofproto import ofproto_v1_3

from controller.apps.confirm import ConfirmingApp
from controller.apps.context import Optirack
from controller.devices.fabric import Fabric, table_changes  # noqa: F401 (the app's names for them)


class FabricApp(ConfirmingApp, app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        self.fabric: Fabric = self.ctx.fabric
        self.rpc = self.fabric.rpc

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        kind, name = self.ctx.known.get(ev.datapath.id, (None, None))
        if kind != "switch":
            return
        if ev.state == MAIN_DISPATCHER:
            self.fabric.connected(name, ev.datapath)
        else:
            self.fabric.disconnected(name, ev.datapath)

    def __getattr__(self, name: str):
        """What the app lacks is the keeper's (tests hold the app)."""
        if name == "fabric":
            raise AttributeError(name)
        return getattr(self.fabric, name)

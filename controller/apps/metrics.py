"""GET /metrics for Prometheus: the registry the controller's wiring built (controller/metrics.py), fed the port
counters of the monitor's polls; and the request counting every REST answer goes through."""
from __future__ import annotations

import logging

from prometheus_client import CONTENT_TYPE_LATEST
from ryu.app.wsgi import ControllerBase, Response, WSGIApplication, route
from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import MAIN_DISPATCHER, set_ev_cls
from ryu.ofproto import ofproto_v1_3

from controller.apps.context import Optirack
from controller.metrics import Metrics

LOG = logging.getLogger("optirack.metrics")


class CountedController(ControllerBase):
    """A WSGI controller whose answers are counted by route template, method and status."""

    def __call__(self, req):
        try:
            resp = super().__call__(req)
        except Exception:
            self._count(req, 500)
            raise
        self._count(req, resp.status_int)
        return resp

    def _count(self, req, status: int) -> None:
        metrics = getattr((self.data or {}).get("optirack"), "metrics", None)
        if metrics is not None:
            action = getattr(type(self), self.req.urlvars.get("action", ""), None)
            metrics.count_request(getattr(action, "routing_info", {}).get("path", "unmatched"), req.method, status)


class MetricsEndpoint(CountedController):
    """GET /metrics, outside /api/v1: Prometheus' text format, no token."""

    @route("metrics", "/metrics", methods=["GET"])
    def metrics(self, req, **_):
        metrics: Metrics = self.data["optirack"].metrics
        resp = Response(body=metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp


class MetricsApp(app_manager.RyuApp):
    """Keeps the latest port counters for /metrics (from the monitor's polls) and serves /metrics."""

    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"optirack": Optirack, "wsgi": WSGIApplication}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        self.metrics: Metrics = self.ctx.metrics
        kwargs["wsgi"].register(MetricsEndpoint, {"optirack": self.ctx})

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev):
        for s in ev.msg.body:
            self.metrics.port_stats(ev.msg.datapath.id, s)

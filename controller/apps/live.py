"""The live page at /: the rack, its jobs and their traffic, pushed to the browser as server-sent events.

Everything the page needs is served here (no CDN, no third-party script); reads need no token, and
the page's regroup button sends the token the user types to the ordinary REST API. The page and its
stream live outside /api/v1, so the API's contract is untouched.
"""
from __future__ import annotations

import json
import logging
from importlib import resources

from ryu.app.wsgi import Response, WSGIApplication, route
from ryu.base import app_manager

from controller.apps.context import Optirack
from controller.apps.live_feed import Feed
from controller.apps.metrics import CountedController
from controller.config import conf

STATIC = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
STATIC_NAME = r"[a-z0-9_-]+\.(?:js|css|svg)"


def _static(name: str) -> bytes | None:
    path = resources.files("controller.apps").joinpath("static", name)
    return path.read_bytes() if path.is_file() else None


def _file_response(name: str) -> Response:
    body = _static(name)
    if body is None:
        return Response(status=404, content_type="text/plain", charset="utf-8", body=f"no such file: {name}\n".encode())
    suffix = name[name.rindex("."):]
    resp = Response(body=body, content_type=STATIC[suffix], charset="utf-8")
    resp.headers["Cache-Control"] = "no-cache"
    return resp


class LivePage(CountedController):
    """GET / (the page), /static/<file>, /live/state (one snapshot) and /live/stream (server-sent events)."""

    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.ctx: Optirack = data["optirack"]

    @route("live_page", "/", methods=["GET"])
    def page(self, req, **_):
        return _file_response("index.html")

    @route("live_static", "/static/{name}", methods=["GET"], requirements={"name": STATIC_NAME})
    def static(self, req, name, **_):
        return _file_response(name)

    @route("live_state", "/live/state", methods=["GET"])
    def state(self, req, **_):
        return Response(content_type="application/json", charset="utf-8",
                        body=json.dumps(Feed(self.ctx).next()).encode())

    @route("live_stream", "/live/stream", methods=["GET"])
    def stream(self, req, **_):
        # eventlet's server holds back chunks smaller than 4 kB unless told otherwise.
        req.environ["eventlet.minimum_write_chunk_size"] = 0
        events = _events(Feed(self.ctx), conf().monitor_interval, self.ctx.rt.sleep)
        resp = Response(app_iter=events, content_type="text/event-stream", charset="utf-8")
        resp.headers["Cache-Control"] = "no-cache"
        resp.headers["X-Accel-Buffering"] = "no"
        return resp


def _events(feed: Feed, interval: float, sleep):
    """A snapshot, then one message of changes per interval, until the browser goes away."""
    yield b"retry: 2000\n\n"
    while True:
        yield b"data: " + json.dumps(feed.next(), separators=(",", ":")).encode() + b"\n\n"
        sleep(interval)


class _ClientGone(logging.Filter):
    """A page closed while its stream was open: eventlet logs the broken pipe as a traceback; drop it."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("Traceback" in text and ("BrokenPipeError" in text or "ConnectionResetError" in text))


class LiveApp(app_manager.RyuApp):
    _CONTEXTS = {"optirack": Optirack, "wsgi": WSGIApplication}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        kwargs["wsgi"].register(LivePage, {"optirack": kwargs["optirack"]})
        logging.getLogger("ryu.lib.hub").addFilter(_ClientGone())  # where Ryu's WSGI server logs


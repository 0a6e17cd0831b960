"""The REST app: optirack's northbound API on Ryu's WSGI server, under /api/v1.

Reads are open; mutations (PUT, POST, DELETE) need ``Authorization: Bearer <token>``. Every error,
on every path, is JSON of one shape, ``{"error": {"status": 400, "field": "circuits[1]", "message":
"…"}}``, and a refused request changes nothing. The OpenAPI document (openapi.json) is the
contract: schemathesis checks the live controller against it (tests/integration/test_contract.py).

To add an endpoint: a handler with ``@route(...)`` and ``@api(...)`` on a subclass of
`OptirackController`, registered in `RestApp`; raise `RequestRefused` (or a domain error `api` maps) for
every refusal; document the path, its parameters with their bounds, and every status it answers
(errors as ``$ref: '#/components/responses/Error'``) in openapi.json. tests/unit/test_rest.py
checks that the routes served and the operations documented are the same.
"""
from __future__ import annotations

import functools
import json
import logging
from importlib import resources

from pydantic import BaseModel, ConfigDict
from ryu.app.wsgi import WSGIApplication, route
from ryu.base import app_manager

from controller.apps import views
from controller.apps.context import Optirack
from controller.apps.http import (  # noqa: F401 (re-exported: the REST app's names)
    MAX_BODY,
    PREFIX,
    PUT_WAIT,
    OptirackController,
    RequestRefused,
    _versioned,
    api,
    check_version,
    choice_param,
    error_response,
    if_match,
    int_param,
    json_response,
    path_text,
    read_json,
)
from controller.apps.jobs_api import JobsApi
from controller.apps.metrics import CountedController
from controller.apps.slurm_api import SlurmApi
from controller.core.circuits import CircuitMap
from controller.core.events import ReconfigEvent

LOG = logging.getLogger("optirack.rest")


class CircuitsBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    circuits: list[list[str]]


class Api(OptirackController):
    """Handlers are a few lines each: parse, call the parts the wiring built (controller/apps/context.py), render with
    `views`."""

    @route("openapi", PREFIX + "/openapi.json", methods=["GET"])
    @api()
    def openapi(self, req, **_):
        return json_response(openapi_for(self.ctx.rack))

    @route("topology", PREFIX + "/topology", methods=["GET"])
    @api()
    def topology(self, req, **_):
        return json_response(views.topology(self.ctx))

    @route("circuits", PREFIX + "/ocs/circuits", methods=["GET"])
    @api()
    def get_circuits(self, req, **_):
        device = choice_param(req, "device", ("0", "1"), "0") == "1"
        return _versioned(json_response(views.circuits(self.ctx, device=device)), self.ctx)

    @route("circuits", PREFIX + "/ocs/circuits", methods=["PUT"])
    @api(mutation=True)
    def put_circuits(self, req, **_):
        body = read_json(req, CircuitsBody)
        target = CircuitMap.parse(self.ctx.rack, body.circuits)
        expected = if_match(req)

        unchanged = {}

        def plan(current: CircuitMap) -> CircuitMap:  # under the reconfiguration lock
            check_version(expected, self.ctx.circuits_version)
            views.check_protected(self.ctx, current, target)
            unchanged.update(version=self.ctx.circuits_version)
            return target

        ev = self.ctx.changes.change(plan, "circuits", "PUT /ocs/circuits", wait=PUT_WAIT)
        version = ev.version if ev else unchanged["version"]  # what this request left, not what came after
        resp = json_response({"circuits": target.to_json(), "version": version, "event": ev.to_json() if ev else None})
        resp.headers["ETag"] = f'"{version}"'
        return resp

    @route("stats", PREFIX + "/stats/ports", methods=["GET"])
    @api()
    def stats(self, req, **_):
        return json_response(views.port_stats(self.ctx, int_param(req, "history", 0, lo=0, hi=100_000)))

    @route("events", PREFIX + "/events", methods=["GET"])
    @api()
    def events(self, req, **_):
        limit, before = int_param(req, "limit", 100), int_param(req, "before", None, lo=1, hi=1 << 62)
        rows = self.ctx.store.events(limit + 1, before)  # one more tells whether an older page exists
        page = rows[-limit:]
        return json_response(
            {
                "events": [ReconfigEvent.from_state(r).to_json() for r in page],
                "older": page[0]["id"] if len(rows) > len(page) else None,
            }
        )


@functools.cache
def _openapi_text() -> str:
    return resources.files("controller.apps").joinpath("openapi.json").read_text()


def _openapi() -> dict:
    """The document as written (a fresh copy)."""
    return json.loads(_openapi_text())


def openapi_for(rack) -> dict:
    """The document as this controller serves it: its rack's GPU names, GPU models and OCS ports as enums, so a
    client (or a fuzzer) knows which names exist."""
    doc = _openapi()
    schemas = doc["components"]["schemas"]
    schemas["GpuName"]["enum"] = sorted(rack.gpus)
    schemas["PortName"]["enum"] = [str(p) for p in sorted(rack.endpoints, key=lambda p: (p.device, p.port))]
    schemas["JobRequest"]["properties"]["gpu_model"]["enum"] = sorted({g.model for g in rack.gpus.values()}) + [None]
    nodes = schemas["SlurmJobRequest"]["properties"]["nodes"]  # Slurm's nodes are the servers, GRES index = GPU index
    item = nodes.pop("additionalProperties")
    nodes["properties"] = {s: {**item, "items": {"type": "integer", "enum": list(range(len(rack.servers[s].gpus)))}}
                           for s in rack.servers}
    nodes["additionalProperties"] = False
    return doc


def allowed_methods(path: str) -> set[str]:
    """Methods the OpenAPI document lists for a concrete path (a template like {job_id} matches one
    segment; a literal path such as /jobs/prune wins over /jobs/{job_id})."""
    parts = path.rstrip("/").split("/")
    best: tuple[int, set[str]] = (-1, set())
    for template, ops in _openapi()["paths"].items():
        tparts = (PREFIX + template).split("/")
        if len(tparts) == len(parts) and all(
            t == p or (t.startswith("{") and p) for t, p in zip(tparts, parts, strict=True)
        ):
            literal = sum(t == p for t, p in zip(tparts, parts, strict=True))
            if literal > best[0]:
                best = (literal, {m.upper() for m in ops})
    return best[1]


class NotFound(CountedController):
    """Registered last: takes every request no other route took, on any path: a JSON 405 (with
    Allow) for a documented path asked with another method, else a JSON 404."""

    @route("notfound", "/{path}", requirements={"path": r"[\s\S]*"})
    @api()
    def not_found(self, req, **_):
        path = path_text(req.environ.get("PATH_INFO", ""))
        methods = allowed_methods(path)
        if methods and req.method not in methods:
            resp = error_response(
                RequestRefused(405, f"{req.method} is not allowed here; use {', '.join(sorted(methods))}"))
            resp.headers["Allow"] = ", ".join(sorted(methods))
            return resp
        return error_response(RequestRefused(404, f"no such endpoint: {path} (see {PREFIX}/openapi.json)"))


class RestApp(app_manager.RyuApp):
    _CONTEXTS = {"optirack": Optirack, "wsgi": WSGIApplication}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.wsgi, self.ctx = kwargs["wsgi"], kwargs["optirack"]
        for cls in (Api, JobsApi, SlurmApi):
            self.wsgi.register(cls, {"optirack": self.ctx})

    def start(self):
        # After every app's constructor registered its routes (/metrics, the live page at /): the
        # catch-all comes last, or it would take their paths.
        self.wsgi.register(NotFound, {"optirack": self.ctx})
        return super().start()

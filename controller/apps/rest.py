"""The REST app: optirack's northbound API on Ryu's WSGI server, under /api/v1.

Reads are open; mutations (PUT, POST, DELETE) need ``Authorization: Bearer <token>``. Every error,
on every path, is JSON of one shape, ``{"error": {"status": 400, "field": "circuits[1]", "message":
"…"}}``, and a refused request changes nothing. The OpenAPI document (openapi.json) is the
contract: schemathesis checks the live controller against it (tests/integration/test_contract.py).

To add an endpoint: a handler with ``@route(...)`` and ``@api(...)`` on a subclass of
`OptirackController`, registered in `RestApp`; raise `ApiError` (or a domain error `api` maps) for
every refusal; document the path, its parameters with their bounds, and every status it answers
(errors as ``$ref: '#/components/responses/Error'``) in openapi.json. tests/unit/test_rest.py
checks that the routes served and the operations documented are the same.
"""
from __future__ import annotations

import functools
import hmac
import json
import logging
import re
from importlib import resources

from pydantic import BaseModel, ConfigDict, ValidationError
from ryu.app.wsgi import Response, WSGIApplication, route
from ryu.base import app_manager

from controller.apps import views
from controller.apps.context import Conflict, Optirack
from controller.apps.metrics import CountedController
from controller.apps.ocs import ReconfigFailed
from controller.core.circuits import CircuitError, CircuitMap
from controller.core.events import ReconfigEvent
from controller.drivers.ocs import OcsUnavailable

LOG = logging.getLogger("optirack.rest")
PREFIX = "/api/v1"
MAX_BODY = 1 << 20
PUT_WAIT = 10.0  # seconds a PUT waits for a reconfiguration under way before it is refused (409)


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def json_response(body, status: int = 200) -> Response:
    return Response(status=status, content_type="application/json", charset="utf-8",
                    body=json.dumps(body, indent=1).encode() + b"\n")


def error_response(e: ApiError, **extra) -> Response:
    """The one shape of every error: {"error": {"status", "message", "field"?}}, plus `extra` keys."""
    err = {"status": e.status, "message": e.message}
    if e.field:
        err["field"] = e.field
    resp = json_response({"error": err, **extra}, e.status)
    if e.status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="optirack"'
    return resp


def _pydantic_error(e: ValidationError) -> ApiError:
    err = e.errors()[0]
    field = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(err["loc"]))
    message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
    return ApiError(400, message, field or "body")


def api(mutation: bool = False):
    """Wrap a handler: bearer token for mutations; every refusal and failure to the JSON error shape.
    This is the one place where errors become responses."""

    def wrap(handler):
        @functools.wraps(handler)
        def wrapper(self, req, **kwargs):
            try:
                if mutation:
                    self.authorize(req)
                return handler(self, req, **kwargs)
            except ApiError as e:
                return error_response(e)
            except CircuitError as e:
                return error_response(ApiError(400, e.problem, e.field))
            except Conflict as e:
                return error_response(ApiError(409, str(e)))
            except OcsUnavailable as e:
                return error_response(ApiError(503, str(e)))
            except ReconfigFailed as e:
                return error_response(ApiError(502, f"the device failed: {e}; rolled back"), event=e.event.to_json())
            except UnicodeDecodeError:
                return error_response(ApiError(400, "the request is not valid UTF-8"))
            except Exception as e:  # a bug: still answer in the documented shape, and log it
                LOG.exception("%s %s failed", req.method, req.environ.get("PATH_INFO", "?"))
                return error_response(
                    ApiError(500, f"internal error ({e.__class__.__name__}); see the controller's log")
                )

        return wrapper

    return wrap


def read_json(req, model: type[BaseModel]) -> BaseModel:
    if req.content_length and req.content_length > MAX_BODY:
        raise ApiError(413, f"body larger than {MAX_BODY} bytes")
    raw = req.body
    if not raw.strip():
        raise ApiError(400, "a JSON body is required", "body")
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, f"not valid JSON: {e}", "body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "expected a JSON object", "body")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _pydantic_error(e) from None


class CircuitsBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    circuits: list[list[str]]


def int_param(req, name: str, default: int | None, lo: int = 1, hi: int = 100_000) -> int | None:
    """A query parameter that must be an integer in [lo, hi] (document the same bounds in openapi.json)."""
    text = req.GET.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]{1,19}", text) or not lo <= int(text) <= hi:
        raise ApiError(400, f"expected an integer from {lo} to {hi}", name)
    return int(text)


def choice_param(req, name: str, choices: tuple[str, ...], default: str) -> str:
    text = req.GET.get(name, default)
    if text not in choices:
        raise ApiError(400, f"expected one of {', '.join(choices)}", name)
    return text


def path_text(value: str) -> str:
    """A path segment as the client wrote it (WSGI hands it over as Latin-1)."""
    try:
        return value.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return value


_ETAG = re.compile(r'^"(\d+)"$')


def if_match(req) -> set[int] | None:
    """The circuit-map versions a request's If-Match header accepts (None: any, as without the header)."""
    header = req.headers.get("If-Match")
    if header is None or header.strip() == "*":
        return None
    versions = set()
    for tag in header.split(","):
        m = _ETAG.match(tag.strip())
        if not m:
            raise ApiError(400, f'expected the ETag of GET /ocs/circuits, like "12", not {tag.strip()!r}', "If-Match")
        versions.add(int(m.group(1)))
    return versions


def check_version(expected: set[int] | None, current: int) -> None:
    """409 if the map changed since the version the client read; 412 if it names a version never issued."""
    if expected is None or current in expected:
        return
    if max(expected) > current:
        raise ApiError(
            412,
            f"If-Match names version {max(expected)}, which this controller has not issued "
            f"(the circuits are at version {current}); read them again",
            "If-Match",
        )
    raise ApiError(
        409,
        f"the circuits changed since version {max(expected)} (now version {current}): "
        "read them again and decide afresh",
        "If-Match",
    )


def _versioned(resp: Response, ctx: Optirack) -> Response:
    resp.headers["ETag"] = f'"{ctx.circuits_version}"'  # the body was read at this version (no yield between)
    return resp


class OptirackController(CountedController):
    """Base of the REST controllers: the context, and the bearer-token check for mutations."""

    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.ctx: Optirack = data["optirack"]

    def authorize(self, req) -> None:
        header = req.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ApiError(
                401,
                "this request changes the rack: send 'Authorization: Bearer <token>' "
                "(the token is in the controller's state directory)",
            )
        if not hmac.compare_digest(token.strip(), self.ctx.token):
            raise ApiError(401, "wrong token")


class Api(OptirackController):
    """Handlers are a few lines each: parse, call the context's services, render with `views`."""

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

        ev = self.ctx.ocs.change(plan, "circuits", "PUT /ocs/circuits", wait=PUT_WAIT)
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
            resp = error_response(ApiError(405, f"{req.method} is not allowed here; use {', '.join(sorted(methods))}"))
            resp.headers["Allow"] = ", ".join(sorted(methods))
            return resp
        return error_response(ApiError(404, f"no such endpoint: {path} (see {PREFIX}/openapi.json)"))


class RestApp(app_manager.RyuApp):
    _CONTEXTS = {"optirack": Optirack, "wsgi": WSGIApplication}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from controller.apps.jobs_api import JobsApi

        self.wsgi, self.ctx = kwargs["wsgi"], kwargs["optirack"]
        for cls in (Api, JobsApi):
            self.wsgi.register(cls, {"optirack": self.ctx})

    def start(self):
        # After every app's constructor registered its routes (/metrics, the live page at /): the
        # catch-all comes last, or it would take their paths.
        self.wsgi.register(NotFound, {"optirack": self.ctx})
        return super().start()

"""What every REST controller shares: the error shape, the decorator that maps domain errors to statuses and checks
the token, body and parameter parsing, circuit-map versions (ETag, If-Match), and the base controller class. The
REST app (rest.py) and the jobs API (jobs_api.py) both build on it."""
from __future__ import annotations

import functools
import hmac
import json
import logging
import re

from pydantic import BaseModel, ValidationError
from ryu.app.wsgi import Response

from controller.apps.context import Optirack
from controller.apps.metrics import CountedController
from controller.core.cabling import CircuitError
from controller.core.errors import Conflict, OcsUnavailable, ReconfigFailed

LOG = logging.getLogger("optirack.rest")
PREFIX = "/api/v1"
MAX_BODY = 1 << 20
PUT_WAIT = 10.0  # seconds a PUT waits for a reconfiguration under way before it is refused (409)


class RequestRefused(Exception):
    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def json_response(body, status: int = 200) -> Response:
    return Response(status=status, content_type="application/json", charset="utf-8",
                    body=json.dumps(body, indent=1).encode() + b"\n")


def error_response(e: RequestRefused, **extra) -> Response:
    """The one shape of every error: {"error": {"status", "message", "field"?}}, plus `extra` keys."""
    err = {"status": e.status, "message": e.message}
    if e.field:
        err["field"] = e.field
    resp = json_response({"error": err, **extra}, e.status)
    if e.status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="optirack"'
    return resp


def _pydantic_error(e: ValidationError) -> RequestRefused:
    err = e.errors()[0]
    field = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(err["loc"]))
    message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
    return RequestRefused(400, message, field or "body")


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
            except RequestRefused as e:
                return error_response(e)
            except CircuitError as e:
                return error_response(RequestRefused(400, e.problem, e.field))
            except Conflict as e:
                return error_response(RequestRefused(409, str(e)))
            except OcsUnavailable as e:
                return error_response(RequestRefused(503, str(e)))
            except ReconfigFailed as e:
                return error_response(RequestRefused(502, f"the device failed: {e}; rolled back"),
                                      event=e.event.to_json())
            except UnicodeDecodeError:
                return error_response(RequestRefused(400, "the request is not valid UTF-8"))
            except Exception as e:  # a bug: still answer in the documented shape, and log it
                LOG.exception("%s %s failed", req.method, req.environ.get("PATH_INFO", "?"))
                return error_response(
                    RequestRefused(500, f"internal error ({e.__class__.__name__}); see the controller's log")
                )

        return wrapper

    return wrap


def read_json(req, model: type[BaseModel]) -> BaseModel:
    if req.content_length and req.content_length > MAX_BODY:
        raise RequestRefused(413, f"body larger than {MAX_BODY} bytes")
    raw = req.body
    if not raw.strip():
        raise RequestRefused(400, "a JSON body is required", "body")
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise RequestRefused(400, f"not valid JSON: {e}", "body") from None
    if not isinstance(data, dict):
        raise RequestRefused(400, "expected a JSON object", "body")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _pydantic_error(e) from None


def int_param(req, name: str, default: int | None, lo: int = 1, hi: int = 100_000) -> int | None:
    """A query parameter that must be an integer in [lo, hi] (document the same bounds in openapi.json)."""
    text = req.GET.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]{1,19}", text) or not lo <= int(text) <= hi:
        raise RequestRefused(400, f"expected an integer from {lo} to {hi}", name)
    return int(text)


def choice_param(req, name: str, choices: tuple[str, ...], default: str) -> str:
    text = req.GET.get(name, default)
    if text not in choices:
        raise RequestRefused(400, f"expected one of {', '.join(choices)}", name)
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
            raise RequestRefused(400, f'expected the ETag of GET /ocs/circuits, like "12", not {tag.strip()!r}',
                                 "If-Match")
        versions.add(int(m.group(1)))
    return versions


def check_version(expected: set[int] | None, current: int) -> None:
    """409 if the map changed since the version the client read; 412 if it names a version never issued."""
    if expected is None or current in expected:
        return
    if max(expected) > current:
        raise RequestRefused(
            412,
            f"If-Match names version {max(expected)}, which this controller has not issued "
            f"(the circuits are at version {current}); read them again",
            "If-Match",
        )
    raise RequestRefused(
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
            raise RequestRefused(
                401,
                "this request changes the rack: send 'Authorization: Bearer <token>' "
                "(the token is in the controller's state directory)",
            )
        if not hmac.compare_digest(token.strip(), self.ctx.token):
            raise RequestRefused(401, "wrong token")

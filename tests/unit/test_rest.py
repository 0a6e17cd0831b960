"""The REST contract in process: the routes served are the operations documented, every error on
every path is JSON of one shape, and the bounds the server enforces are the document's."""
from __future__ import annotations

import json

import pytest
from webob import Request

from controller.apps.context import Optirack
from controller.apps.jobs_api import JobsApi
from controller.apps.placement import PlacementApp
from controller.apps.rest import Api, NotFound, _openapi
from controller.apps.slurm_api import SlurmApi
from controller.core.rack import load_rack
from profiles import WORKLOADS
from tests.unit.fakes import FakeDriver
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)
DOC = _openapi()
CONTROLLERS = (Api, JobsApi, SlurmApi)  # every REST controller but NotFound; add yours here


@pytest.fixture
def app(tmp_path):
    return _app(tmp_path)


def _app(tmp_path):
    from ryu.app.wsgi import WSGIApplication

    ctx = Optirack(rack=RACK, state_dir=tmp_path, containers=FakeDriver())
    PlacementApp(optirack=ctx)  # starts the job service the context built
    wsgi = WSGIApplication()
    for cls in (*CONTROLLERS, NotFound):  # as RestApp registers them: NotFound last
        wsgi.register(cls, {"optirack": ctx})
    return wsgi


def call(app, path: str, method: str = "GET", **kw):
    resp = Request.blank(path, method=method, **kw).get_response(app)
    return resp, json.loads(resp.body)


def _is_error(body: dict, status: int) -> bool:
    err = body.get("error", {})
    return set(err) <= {"status", "message", "field"} and err["status"] == status and isinstance(err["message"], str)


def test_routes_served_are_the_operations_documented():
    documented = {(m.upper(), path) for path, ops in DOC["paths"].items() for m in ops}
    served = set()
    for cls in CONTROLLERS:
        for name in dir(cls):
            info = getattr(getattr(cls, name), "routing_info", None)
            if info:
                served |= {(m, info["path"].removeprefix("/api/v1")) for m in info["methods"] or []}
    assert served == documented, (
        f"undocumented: {served - documented}; documented but not served: {documented - served}"
    )


def test_every_error_answer_is_documented_with_the_error_shape():
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            for status, resp in op["responses"].items():
                if int(status) >= 400:  # the shared response, or one with its own description and the same schema
                    assert resp == {"$ref": "#/components/responses/Error"} or resp["content"] == {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    }, (method, path, status)


@pytest.mark.parametrize(
    "path, method, status",
    [
        ("/", "GET", 404),
        ("/nothing", "POST", 404),
        ("/api/v1/nothing", "GET", 404),
        ("/api/v1/jobs/job-999", "GET", 404),
        ("/api/v1/jobs/%C3%A9t%C3%A9", "GET", 404),
        ("/api/v1/jobs/%0A", "GET", 404),
        ("/api/v1/jobs/%FF%FE", "GET", 404),
        ("/api/v1/ocs/circuits", "POST", 405),
        ("/api/v1/jobs/job-1", "PATCH", 405),
        ("/api/v1/topology", "OPTIONS", 405),
        ("/api/v1/events?limit=0", "GET", 400),
        ("/api/v1/events?limit=%D9%A3", "GET", 400),
        ("/api/v1/events?limit=" + "9" * 5000, "GET", 400),
        ("/api/v1/stats/ports?history=-1", "GET", 400),
        ("/api/v1/ocs/circuits?device=yes", "GET", 400),
        ("/api/v1/jobs/job-1?history=x", "GET", 404),
        ("/api/v1/ocs/circuits", "PUT", 401),
        ("/api/v1/jobs", "POST", 401),
    ],
)
def test_errors_are_json_of_one_shape_everywhere(app, path, method, status):
    resp, body = call(app, path, method)
    assert resp.status_int == status and resp.content_type == "application/json", (resp.status, resp.body[:200])
    assert _is_error(body, status), body
    if status == 405:
        assert set(resp.headers["Allow"].split(", ")) == {m.upper() for m in _documented(path)}


def _documented(path: str) -> set[str]:
    from controller.apps.rest import allowed_methods

    return allowed_methods(path)


def test_unknown_job_ids_are_404_for_every_method(app, tmp_path):
    token = {"Authorization": "Bearer " + (tmp_path / "token").read_text().strip()}
    for method, path in [
        ("GET", "/api/v1/jobs/%F0%9F%98%80"),
        ("DELETE", "/api/v1/jobs/r%C3%B6"),
        ("POST", "/api/v1/jobs/x%20y/regroup"),
    ]:
        resp, body = call(app, path, method, headers=token)
        assert resp.status_int == 404 and _is_error(body, 404) and body["error"]["field"] == "job_id", (
            method,
            path,
            body,
        )


def test_query_bounds_are_the_documents():
    params = {
        (path, p["name"]): p["schema"]
        for path, ops in DOC["paths"].items()
        for op in ops.values()
        for p in op.get("parameters", [])
        if p["in"] == "query"
    }
    assert params[("/events", "limit")] == {"type": "integer", "minimum": 1, "maximum": 100000, "default": 100}
    assert params[("/stats/ports", "history")]["maximum"] == 100000
    assert params[("/jobs/{job_id}", "history")]["maximum"] == 100000
    assert params[("/ocs/circuits", "device")]["enum"] == ["0", "1"]


def test_job_request_schema_is_the_servers():
    from controller.core.jobs import JobRequest, Workload

    schema = DOC["components"]["schemas"]["JobRequest"]
    workload = schema["properties"]["workload"]["properties"]
    assert workload["model"]["enum"] == sorted(WORKLOADS)
    for name, field in Workload.model_fields.items():
        bounds = {m.__class__.__name__: m for m in field.metadata}
        if "Le" in bounds:
            assert workload[name]["maximum"] == bounds["Le"].le, name
        if "Ge" in bounds:
            assert workload[name]["minimum"] == bounds["Ge"].ge, name
    assert set(workload) == set(Workload.model_fields) and set(schema["properties"]) == set(JobRequest.model_fields)


def test_the_served_document_names_the_racks_gpus_and_ports(app):
    resp, doc = call(app, "/api/v1/openapi.json")
    assert resp.status_int == 200
    schemas = doc["components"]["schemas"]
    assert sorted(schemas["GpuName"]["enum"]) == ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6"]
    assert "ocs1:1" in schemas["PortName"]["enum"] and "ocs1:11" in schemas["PortName"]["enum"]
    assert "ocs1:300" not in schemas["PortName"]["enum"]


def test_get_jobs_shows_the_queue_discipline_the_document_lists(app):
    from controller.config import OPTS

    resp, body = call(app, "/api/v1/jobs")
    assert resp.status_int == 200 and body["queue"] == "fifo"  # the default
    doc = DOC["paths"]["/jobs"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["properties"]
    (opt,) = [o for o in OPTS if o.name == "queue"]
    assert doc["queue"]["enum"] == list(opt.type.choices)
    estimate = DOC["components"]["schemas"]["JobRequest"]["properties"]["estimate_s"]
    assert (estimate["minimum"], estimate["exclusiveMinimum"], estimate["maximum"]) == (0, True, 10_000_000)


@pytest.mark.parametrize("queue", ["sjf", "backfill"])
def test_a_job_without_estimate_s_is_400_naming_it_where_the_controller_queues_by_it(tmp_path, queue):
    from ryu import cfg

    import controller.config  # noqa: F401  (registers the [optirack] options)

    cfg.CONF.set_override("queue", queue, group="optirack")
    try:
        app = _app(tmp_path)
    finally:
        cfg.CONF.clear_override("queue", group="optirack")
    token = {"Authorization": "Bearer " + (tmp_path / "token").read_text().strip()}
    assert call(app, "/api/v1/jobs")[1]["queue"] == queue
    resp, body = call(app, "/api/v1/jobs", "POST", headers=token, json={"gpus": 2})
    assert resp.status_int == 400 and _is_error(body, 400) and body["error"]["field"] == "estimate_s", body
    assert f"this controller queues by {queue}" in body["error"]["message"]
    assert call(app, "/api/v1/jobs")[1]["jobs"] == []  # nothing changed
    for bad in (0, -1, 1e8, "soon"):  # the document's bounds: > 0, <= 10,000,000 seconds
        resp, body = call(app, "/api/v1/jobs", "POST", headers=token, json={"gpus": 2, "estimate_s": bad})
        assert resp.status_int == 400 and body["error"]["field"] == "estimate_s", (bad, body)


def test_a_bad_collective_is_400_naming_it_and_changes_nothing(app, tmp_path):
    token = {"Authorization": "Bearer " + (tmp_path / "token").read_text().strip()}
    assert DOC["components"]["schemas"]["JobRequest"]["properties"]["collective"]["enum"] == ["ring", "aggregate"]
    for bad in ("tree", "", 1, None):
        resp, body = call(app, "/api/v1/jobs", "POST", headers=token, json={"gpus": 2, "collective": bad})
        assert resp.status_int == 400 and _is_error(body, 400) and body["error"]["field"] == "collective", (bad, body)
    assert call(app, "/api/v1/jobs")[1]["jobs"] == []

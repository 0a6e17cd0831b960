"""Jobs Slurm scheduled, on the controller with fake switches on virtual time: regrouped under one switch at
allocation, held while they run, released at their end; fragmented (or refused, with hold) when no switch can take
them; and the REST contract of /slurm/jobs."""
from __future__ import annotations

import json

import pytest
from webob import Request

from controller.apps.jobs_api import JobsApi
from controller.apps.rest import Api, NotFound
from controller.apps.slurm_api import SlurmApi
from controller.jobs.errors import Conflict, UnknownJob
from controller.slurm.jobs import SlurmJobs
from tests.unit.fakes import FakeDriver
from tests.unit.test_jobs import RACK, make


def _call(vrt, fn, *args):
    task = vrt.spawn(fn, *args, raise_error=True)
    vrt.run(lambda: task.done, what=getattr(fn, "__name__", "the call"))
    if task.error:
        raise task.error
    return task.result


def test_a_slurm_job_is_regrouped_held_and_released_without_containers(tmp_path, vrt):
    driver = FakeDriver()
    ctx, placement, ocs = make(tmp_path, driver, vrt)
    slurm = SlurmJobs(placement)
    gpus = ["gpu1", "gpu2", "gpu3", "gpu4"]  # srv1, srv2 under as1; srv3, srv4 under as2
    assert len({ctx.circuits.gpu_locations(RACK)[g][0] for g in gpus}) == 2
    job = _call(vrt, slurm.begin, "12", "alice", gpus, False)
    assert job.id == "slurm-12" and job.state == "running" and len(job.switches) == 1 and len(job.events) == 1
    assert {ctx.circuits.gpu_locations(RACK)[g][0] for g in gpus} == set(job.switches)  # the controller's map
    assert ocs.circuits() == {(a.port, b.port) for a, b in ctx.circuits.circuits}  # the OCS itself
    assert job.request["slurm"] == {"job": "12", "user": "alice"} and "under" in job.note
    assert driver.started == []  # Slurm runs the ranks
    assert set(placement.busy_gpus()) == set(gpus)
    with pytest.raises(Conflict, match="gpu1 is held by slurm-12"):
        _call(vrt, slurm.begin, "13", "bob", ["gpu1", "gpu5"], False)
    assert _call(vrt, slurm.end, "12", "COMPLETED").state == "done"
    assert placement.busy_gpus() == {} and job.request["slurm"]["state"] == "COMPLETED"
    assert _call(vrt, slurm.end, "12", "COMPLETED").state == "done"  # the epilog again: answered as it is
    with pytest.raises(UnknownJob):
        slurm.end("99", "COMPLETED")


@pytest.mark.parametrize("state, final", [("CANCELLED by 0", "stopped"), ("TIMEOUT", "failed"),
                                          ("NODE_FAIL", "failed"), ("FAILED", "failed")])
def test_every_way_a_slurm_job_ends_releases_its_gpus(tmp_path, vrt, state, final):
    ctx, placement, _ = make(tmp_path, FakeDriver(), vrt)
    slurm = SlurmJobs(placement)
    _call(vrt, slurm.begin, "7", "", ["gpu1", "gpu3"], False)
    job = _call(vrt, slurm.end, "7", state)
    assert job.state == final and (job.reason or "").endswith(state) and placement.busy_gpus() == {}


def _small_rack(tmp_path):
    """The paper rack with 3 downlinks per switch: as1 11-13 (gpu1, gpu5, gpu2), as2 21-23 (gpu3, gpu6, gpu4)."""
    import yaml

    from controller.core.rack import load_rack
    from tests.unit.test_rack import PAPER

    spec = yaml.safe_load(open(PAPER).read())
    for w in spec["switches"]:
        w["downlinks"] = w["downlinks"][:3]
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_rack(path)


@pytest.mark.parametrize("hold", [False, True])
def test_no_switch_for_all_gpus_runs_fragmented_or_is_refused_with_hold(tmp_path, vrt, monkeypatch, hold):
    import tests.unit.test_jobs as tj

    rack = _small_rack(tmp_path)
    monkeypatch.setattr(tj, "RACK", rack)
    ctx, placement, _ = make(tmp_path, FakeDriver(), vrt)
    slurm = SlurmJobs(placement)
    _call(vrt, slurm.begin, "1", "", ["gpu1", "gpu5"], False)  # as1 11, 12
    _call(vrt, slurm.begin, "2", "", ["gpu6"], False)  # as2 22
    before = ctx.circuits
    # gpu2, gpu3, gpu4: as1 has one free downlink (13), as2 two (21, 23)
    if hold:
        with pytest.raises(Conflict, match="cannot regroup"):
            _call(vrt, slurm.begin, "3", "", ["gpu2", "gpu3", "gpu4"], True)
        assert "slurm-3" not in placement.jobs and ctx.circuits == before
        return
    job = _call(vrt, slurm.begin, "3", "", ["gpu2", "gpu3", "gpu4"], False)
    assert job.state == "running" and sorted(job.switches) == ["as1", "as2"] and ctx.circuits == before
    assert job.note.startswith("runs fragmented over as1, as2: no switch has a free downlink for every GPU")


def test_rest_contract_of_slurm_jobs(tmp_path, vrt):
    from ryu.app.wsgi import WSGIApplication

    ctx, placement, _ = make(tmp_path, FakeDriver(), vrt)
    wsgi = WSGIApplication()
    for cls in (Api, JobsApi, SlurmApi, NotFound):
        wsgi.register(cls, {"optirack": ctx})
    token = {"Authorization": "Bearer " + (tmp_path / "token").read_text().strip()}

    def post(path, body, headers=token):
        out = {}

        def go():
            resp = Request.blank("/api/v1" + path, method="POST", body=json.dumps(body).encode(),
                                 headers={**headers, "Content-Type": "application/json"}).get_response(wsgi)
            out.update(status=resp.status_int, body=json.loads(resp.body))

        _call(vrt, go)
        return out["status"], out["body"]

    assert post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu1"]}, headers={})[0] == 401
    status, body = post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu9"]})
    assert status == 400 and "gpu9" in body["error"]["message"]
    assert post("/slurm/jobs", {"slurm_job": "x; rm", "gpus": ["gpu1"]})[0] == 400
    assert post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu1", "gpu1"]})[0] == 400
    status, body = post("/slurm/jobs", {"slurm_job": "5", "user": "alice", "gpus": ["gpu1", "gpu3"]})
    assert status == 201 and body["job"]["id"] == "slurm-5" and body["job"]["state"] == "running"
    assert len(body["job"]["switches"]) == 1 and body["note"]
    assert post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu2"]})[0] == 409  # already placed
    status, body = post("/slurm/jobs", {"slurm_job": "6", "gpus": ["gpu5", "gpu6"], "policy": "fixed"})
    assert status == 201 and body["job"]["switches"] == ["as1", "as2"] and not body["job"]["events"]
    assert post("/slurm/jobs", {"slurm_job": "7", "gpus": ["gpu2"], "policy": "spread"})[0] == 400
    jobs = Request.blank("/api/v1/jobs").get_response(wsgi)
    assert [j["request"]["slurm"]["user"] for j in json.loads(jobs.body)["jobs"]] == ["alice", ""]
    status, body = post("/slurm/jobs/5/end", {"state": "COMPLETED"})
    assert status == 200 and body["job"]["state"] == "done"
    assert post("/slurm/jobs/8/end", {})[0] == 404

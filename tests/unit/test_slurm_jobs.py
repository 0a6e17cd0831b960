"""Jobs Slurm scheduled, in the job service on virtual time (a fake circuit-change port): regrouped under one switch at
allocation, held while they run, released at their end; fragmented (or refused, with hold) when no switch can take
them; passed over by what follows containers."""
from __future__ import annotations

import pytest

from controller.apps.context import Optirack
from controller.apps.fabric import FabricApp
from controller.apps.inventory import Inventory
from controller.apps.jobs_api import JobsApi
from controller.apps.ocs import OcsApp
from controller.apps.placement import PlacementApp
from controller.apps.rest import Api, NotFound
from controller.apps.slurm_api import SlurmApi
from controller.core.errors import Conflict
from controller.jobs.errors import UnknownJob
from tests.unit.fakes import FakeDriver as AppDriver
from tests.unit.fakes import FakeSwitch, wait_until
from tests.unit.jobfakes import FakeDriver
from tests.unit.test_jobs import RACK, make


def _call(vrt, fn, *args):
    task = vrt.spawn(fn, *args, raise_error=True)
    vrt.run(lambda: task.done, what=getattr(fn, "__name__", "the call"))
    if task.error:
        raise task.error
    return task.result


def test_a_slurm_job_is_regrouped_held_and_released_without_containers(tmp_path, vrt):
    driver = FakeDriver()
    state, jobs, changes = make(tmp_path, driver, vrt)
    gpus = ["gpu1", "gpu2", "gpu3", "gpu4"]  # srv1, srv2 under as1; srv3, srv4 under as2
    assert len({state.circuits.gpu_locations(RACK)[g][0] for g in gpus}) == 2
    job = _call(vrt, jobs.begin_external, "slurm", "12", "alice", gpus)
    assert job.id == "slurm-12" and job.state == "running" and len(job.switches) == 1 and len(job.events) == 1
    assert {state.circuits.gpu_locations(RACK)[g][0] for g in gpus} == set(job.switches)
    assert changes.made[-1].job == "slurm-12"
    assert job.request["external"] == {"scheduler": "slurm", "job": "12", "user": "alice"} and "under" in job.note
    assert driver.started == []  # Slurm runs the ranks
    assert set(jobs.busy_gpus()) == set(gpus)
    with pytest.raises(Conflict, match="gpu1 is held by slurm-12"):
        _call(vrt, jobs.begin_external, "slurm", "13", "bob", ["gpu1", "gpu5"])
    vrt.advance(30)  # the watches on engines and servers pass it over: still running
    assert job.state == "running"
    assert _call(vrt, jobs.end_external, "slurm", "12", "COMPLETED").state == "done"
    assert jobs.busy_gpus() == {} and job.request["external"]["state"] == "COMPLETED"
    assert _call(vrt, jobs.end_external, "slurm", "12", "COMPLETED").state == "done"  # the epilog again: as it is
    with pytest.raises(UnknownJob):
        jobs.end_external("slurm", "99", "COMPLETED")


@pytest.mark.parametrize("state, final", [("CANCELLED by 0", "stopped"), ("TIMEOUT", "failed"),
                                          ("NODE_FAIL", "failed"), ("FAILED", "failed")])
def test_every_way_a_slurm_job_ends_releases_its_gpus(tmp_path, vrt, state, final):
    _, jobs, _ = make(tmp_path, FakeDriver(), vrt)
    _call(vrt, jobs.begin_external, "slurm", "7", "", ["gpu1", "gpu3"])
    job = _call(vrt, jobs.end_external, "slurm", "7", state)
    assert job.state == final and (job.reason or "").endswith(state) and jobs.busy_gpus() == {}


def test_a_restart_keeps_a_running_slurm_job(tmp_path, vrt):
    from tests.unit.virtual import VirtualRuntime

    _, jobs, _ = make(tmp_path, FakeDriver(), vrt)
    _call(vrt, jobs.begin_external, "slurm", "3", "", ["gpu1", "gpu3"])
    rt2 = VirtualRuntime()
    _, again, _ = make(tmp_path, FakeDriver(), rt2)  # no worker of it on any engine: it is not one of ours to follow
    assert again.get("slurm-3").state == "running" and set(again.busy_gpus()) == {"gpu1", "gpu3"}


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

    monkeypatch.setattr(tj, "RACK", _small_rack(tmp_path))
    state, jobs, _ = make(tmp_path, FakeDriver(), vrt)
    _call(vrt, jobs.begin_external, "slurm", "1", "", ["gpu1", "gpu5"])  # as1 11, 12
    _call(vrt, jobs.begin_external, "slurm", "2", "", ["gpu6"])  # as2 22
    before = state.circuits
    # gpu2, gpu3, gpu4: as1 has one free downlink (13), as2 two (21, 23)
    if hold:
        with pytest.raises(Conflict, match="cannot regroup"):
            _call(vrt, jobs.begin_external, "slurm", "3", "", ["gpu2", "gpu3", "gpu4"], True)
        assert "slurm-3" not in jobs.jobs and state.circuits == before
        return
    job = _call(vrt, jobs.begin_external, "slurm", "3", "", ["gpu2", "gpu3", "gpu4"])
    assert job.state == "running" and sorted(job.switches) == ["as1", "as2"] and state.circuits == before
    assert job.note.startswith("runs fragmented over as1, as2: no switch has a free downlink for every GPU")


def test_fixed_holds_the_gpus_where_they_are(tmp_path, vrt):
    state, jobs, _ = make(tmp_path, FakeDriver(), vrt)
    before = state.circuits
    job = _call(vrt, jobs.begin_external, "slurm", "4", "", ["gpu5", "gpu6"], False, "fixed")
    assert job.switches == ["as1", "as2"] and not job.events and state.circuits == before and "fixed" in job.note


@pytest.fixture
def rest(tmp_path):
    """The REST app over the controller's apps, with fake OCS and switches connected (as test_apps.rig)."""
    from ryu.app.wsgi import WSGIApplication

    ctx = Optirack(rack=RACK, state_dir=tmp_path, containers=AppDriver())
    apps = [Inventory(optirack=ctx), OcsApp(optirack=ctx), FabricApp(optirack=ctx)]
    devices = [FakeSwitch(0x100, apps)] + [FakeSwitch(RACK.switches[n].dpid, apps) for n in ("as1", "as2")]
    for dp in devices:
        dp.connect()
    wait_until(lambda: "ocs1" in apps[1].synchronised and not ctx.lock.locked(), what="the OCS synchronised")
    PlacementApp(optirack=ctx)
    wsgi = WSGIApplication()
    for cls in (Api, JobsApi, SlurmApi, NotFound):
        wsgi.register(cls, {"optirack": ctx})
    return ctx, wsgi


def test_rest_contract_of_slurm_jobs(rest):
    import json

    from webob import Request

    ctx, wsgi = rest
    token = {"Authorization": f"Bearer {ctx.token}"}

    def post(path, body, headers=token):
        resp = Request.blank("/api/v1" + path, method="POST", body=json.dumps(body).encode(),
                             headers={**headers, "Content-Type": "application/json"}).get_response(wsgi)
        return resp.status_int, json.loads(resp.body)

    assert post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu1"]}, headers={})[0] == 401
    status, body = post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu9"]})
    assert status == 400 and "gpu9" in body["error"]["message"]
    assert post("/slurm/jobs", {"slurm_job": "x; rm", "gpus": ["gpu1"]})[0] == 400
    assert post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu1", "gpu1"]})[0] == 400
    status, body = post("/slurm/jobs", {"slurm_job": "5", "user": "alice", "gpus": ["gpu1", "gpu3"]})
    assert status == 201 and body["job"]["id"] == "slurm-5" and body["job"]["state"] == "running", body
    assert len(body["job"]["switches"]) == 1 and body["note"]
    assert post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu2"]})[0] == 409  # already placed
    status, body = post("/slurm/jobs", {"slurm_job": "6", "gpus": ["gpu5", "gpu6"], "policy": "fixed"})
    assert status == 201 and body["job"]["switches"] == ["as1", "as2"] and not body["job"]["events"]
    assert post("/slurm/jobs", {"slurm_job": "7", "gpus": ["gpu2"], "policy": "spread"})[0] == 400
    jobs = json.loads(Request.blank("/api/v1/jobs").get_response(wsgi).body)["jobs"]
    assert [j["request"]["external"]["user"] for j in jobs] == ["alice", ""]
    status, body = post("/slurm/jobs/5/end", {"state": "COMPLETED"})
    assert status == 200 and body["job"]["state"] == "done"
    assert post("/slurm/jobs/8/end", {})[0] == 404
    # the prolog's form: Slurm's nodes and GRES indexes, named into the rack's GPUs here
    status, body = post("/slurm/jobs", {"slurm_job": "9", "nodes": {"srv4": [0], "srv1": [0]}})
    assert status == 201 and body["job"]["request"]["gpus"] == ["gpu4", "gpu1"], body  # in the order given
    for bad, word in (({"srv9": [0]}, "node srv9 is not a server of rack paper"),
                      ({"srv2": [1]}, "node srv2 has no GPU of GRES index 1"),
                      ({"srv3": [0, 0]}, "a GPU is named twice")):
        status, body = post("/slurm/jobs", {"slurm_job": "10", "nodes": bad})
        assert status == 400 and word in body["error"]["message"] and body["error"]["field"] == "nodes", body
    assert post("/slurm/jobs", {"slurm_job": "10"})[0] == 400  # neither gpus nor nodes
    assert post("/slurm/jobs", {"slurm_job": "10", "gpus": ["gpu2"], "nodes": {"srv2": [0]}})[0] == 400  # both
    assert "slurm-10" not in ctx.jobs.jobs  # nothing of a refused one is kept


@pytest.mark.parametrize("slurm_says, status", [("5|COMPLETING\n", 201), ("5|RUNNING\n", 409)])
def test_a_gpu_still_held_for_a_slurm_job_that_ended_goes_to_the_next_one(rest, slurm_says, status, monkeypatch):
    """slurmctld hands a GPU on while the last job's EpilogSlurmctld runs, or the epilog never comes: after a short
    wait for it, the controller asks Slurm and releases the job it says ended (COMPLETING with its end in sacct); one
    Slurm says still runs keeps its GPU."""
    import json

    from webob import Request

    from controller.apps import slurm_api
    from controller.slurm.scheduler import SlurmScheduler
    from tests.unit.test_slurm_scheduler import Slurm

    monkeypatch.setattr(slurm_api, "EPILOG_WAIT_S", 0.2)

    ctx, wsgi = rest
    ctx.scheduler = SlurmScheduler(ctx.rack, Slurm(squeue=(0, slurm_says, ""), sacct=(0, "5|COMPLETED\n", "")))

    def post(path, body):
        resp = Request.blank("/api/v1" + path, method="POST", body=json.dumps(body).encode(),
                             headers={"Authorization": f"Bearer {ctx.token}", "Content-Type": "application/json"}
                             ).get_response(wsgi)
        return resp.status_int, json.loads(resp.body)

    assert post("/slurm/jobs", {"slurm_job": "5", "gpus": ["gpu1", "gpu3"]})[0] == 201
    code, body = post("/slurm/jobs", {"slurm_job": "6", "nodes": {"srv1": [0]}})
    assert code == status, body
    old = ctx.jobs.jobs["slurm-5"]
    if status == 201:
        assert old.state == "done" and old.request["external"]["state"] == "COMPLETED"
    else:
        assert old.state == "running" and "gpu1 is held by slurm-5" in body["error"]["message"]


class FakeScheduler:
    """The job service's scheduler port (controller/jobs/ports.py) as a fake: what it was told, and which jobs it says
    ended."""

    def __init__(self, ended=None):
        self.calls: list[tuple] = []
        self.said_ended = ended or {}

    def node_lost(self, job, server, why):
        self.calls.append(("lost", job, server, why))

    def node_back(self, server):
        self.calls.append(("back", server))

    def ended(self, jobs):
        self.calls.append(("ended", sorted(jobs)))
        return {j: s for j, s in self.said_ended.items() if j in jobs}


def test_the_loop_tells_slurm_of_a_dead_server_under_its_job_once_and_of_its_return(tmp_path, vrt):
    from tests.unit.jobfakes import service

    slurm, driver = FakeScheduler(), FakeDriver()
    jobs, state, _ = service(tmp_path, RACK, driver, vrt, scheduler=slurm)
    vrt.advance(0)
    job = _call(vrt, jobs.begin_external, "slurm", "12", "alice", ["gpu1", "gpu2", "gpu3", "gpu4"])
    other = next(g for g in RACK.gpus if RACK.server_of[g] != "srv2" and g not in job.gpus)
    _call(vrt, jobs.begin_external, "slurm", "13", "bob", [other])
    driver.kill_server("srv2")
    vrt.run(lambda: any(c[0] == "lost" for c in slurm.calls), what="Slurm to be told")
    vrt.advance(10)  # the watches go on: told once, and the job is left to Slurm (its epilog ends it)
    (lost,) = [c for c in slurm.calls if c[0] == "lost"]
    assert lost[:3] == ("lost", "12", "srv2") and "srv2" in lost[3], lost
    assert job.state == "running" and jobs.get("slurm-13").state == "running"
    assert not any(c[0] == "back" for c in slurm.calls)
    driver.engines.back.add("srv2")
    vrt.run(lambda: ("back", "srv2") in slurm.calls, what="Slurm to be told the server is back")


def test_a_restarted_controller_asks_slurm_and_releases_the_jobs_that_ended_meanwhile(tmp_path, vrt):
    from tests.unit.jobfakes import service
    from tests.unit.virtual import VirtualRuntime

    jobs, _, _ = service(tmp_path, RACK, FakeDriver(), vrt)
    vrt.advance(0)
    for sid, gpus in (("3", ["gpu1", "gpu3"]), ("4", ["gpu2"]), ("5", ["gpu4"])):
        _call(vrt, jobs.begin_external, "slurm", sid, "", gpus)
    _call(vrt, jobs.end_external, "slurm", "5", "COMPLETED")  # ended before: not asked about
    slurm, rt2 = FakeScheduler(ended={"3": "COMPLETED", "4": "PENDING (requeued)"}), VirtualRuntime()
    again, _, _ = service(tmp_path, RACK, FakeDriver(), rt2, scheduler=slurm)
    rt2.run(lambda: not again.get("slurm-3").active and not again.get("slurm-4").active, what="the release")
    assert ("ended", ["3", "4"]) in slurm.calls
    assert again.get("slurm-3").state == "done" and again.get("slurm-4").state == "failed"
    assert "requeued" in again.get("slurm-4").reason and again.busy_gpus() == {}
    assert [again.get(f"slurm-{j}").request["external"]["state"] for j in "345"] == [
        "COMPLETED", "PENDING (requeued)", "COMPLETED"]  # Slurm's, as its epilog would have said it
    rt2.close()


def test_a_slurm_job_keeps_no_warm_spare_on_a_gpu_slurm_may_give_out(tmp_path, vrt):
    from tests.unit.jobfakes import service

    driver = FakeDriver()
    jobs, _, _ = service(tmp_path, RACK, driver, vrt, keep_survivors=True)  # warm spares on, as the controller's
    vrt.advance(0)
    _call(vrt, jobs.begin_external, "slurm", "12", "", ["gpu1", "gpu2"])
    _call(vrt, jobs.begin_external, "slurm", "13", "", ["gpu3"])
    _call(vrt, jobs.end_external, "slurm", "13", "COMPLETED")  # GPUs freed: running jobs short of spares get them
    vrt.advance(10)
    assert driver.started == [] and jobs.book.warm == {}  # its ranks are Slurm's: no worker of ours anywhere

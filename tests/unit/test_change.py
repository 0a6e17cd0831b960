"""One rule for every change of circuits: plan and apply under the reconfiguration lock (OcsApp.change)."""
from __future__ import annotations

import json

import pytest
from ryu.lib import hub
from webob import Request

from controller.apps.context import Optirack
from controller.apps.fabric import FabricApp
from controller.apps.inventory import Inventory
from controller.apps.ocs import OcsApp
from controller.apps.placement import PlacementApp
from controller.apps.rest import Api, NotFound
from controller.core.circuits import CircuitMap
from controller.core.errors import Busy, Conflict
from controller.core.jobs import JobRequest
from controller.core.rack import load_rack
from tests.unit.fakes import FakeDriver, FakeSwitch, wait_until
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)
INITIAL = CircuitMap.initial(RACK)  # 1-11 5-12 2-13 | 3-21 6-22 4-23
SWAPPED = CircuitMap.parse(RACK, [[str(a), str(b)] for a, b in INITIAL.circuits if 5 not in (a.port, b.port)
                                  and 6 not in (a.port, b.port)] + [["ocs1:5", "ocs1:22"], ["ocs1:6", "ocs1:12"]])


def tight_rack():
    """The paper rack with three downlinks per switch: the starting circuits use every one."""
    data = RACK.spec.model_dump(mode="json")
    for w in data["switches"]:
        w["downlinks"] = w["downlinks"][:3]
    return type(RACK)(type(RACK.spec).model_validate(data))


def make(tmp_path, rack=RACK, driver=None):
    ctx = Optirack(rack=rack, state_dir=tmp_path, containers=driver or FakeDriver(block=True))
    ocs_app = OcsApp(optirack=ctx)
    apps = [Inventory(optirack=ctx), ocs_app, FabricApp(optirack=ctx)]
    placement = PlacementApp(optirack=ctx).service
    dps = [FakeSwitch(0x100, apps), FakeSwitch(0x201, apps), FakeSwitch(0x202, apps)]
    for dp in dps:
        dp.connect()
    wait_until(lambda: "ocs1" in ocs_app.synchronised and not ctx.lock.locked(), what="the OCS synchronised")
    return ctx, ocs_app, placement, dps[0]


def device(ocs) -> set[tuple[int, int]]:
    return ocs.circuits()


def pairs(m: CircuitMap) -> set[tuple[int, int]]:
    return {(a.port, b.port) for a, b in m.circuits}


def req(**kw) -> JobRequest:
    kw.setdefault("workload", {"iterations": 3})
    return JobRequest.model_validate(kw)


def test_change_plans_under_the_lock_from_the_current_map_and_bumps_the_version(tmp_path):
    ctx, ocs_app, _, ocs = make(tmp_path)
    seen = []

    def plan(current):
        seen.append((current, ctx.lock.locked()))
        return SWAPPED

    v0 = ctx.circuits_version
    ev = ocs_app.changes.change(plan, "circuits", "test")
    assert seen == [(INITIAL, True)]
    assert ev.status == "ok" and ctx.circuits == SWAPPED and device(ocs) == pairs(SWAPPED)
    assert ctx.circuits_version > v0 and not ctx.lock.locked()
    assert {tuple(c) for c in ev.removed} == {("ocs1:5", "ocs1:12"), ("ocs1:6", "ocs1:22")}
    assert {tuple(c) for c in ev.added} == {("ocs1:5", "ocs1:22"), ("ocs1:6", "ocs1:12")}


def test_no_change_is_no_event_and_keeps_the_version(tmp_path):
    ctx, ocs_app, _, _ = make(tmp_path)
    v0, events = ctx.circuits_version, len(ctx.events.recent())
    assert ocs_app.changes.change(lambda current: None, "circuits", "nothing") is None
    assert ocs_app.changes.change(lambda current: current, "circuits", "the same") is None
    assert ctx.circuits_version == v0 and len(ctx.events.recent()) == events


def test_a_plan_that_refuses_changes_nothing_and_frees_the_lock(tmp_path):
    ctx, ocs_app, _, ocs = make(tmp_path)

    def plan(current):
        raise Conflict("no")

    with pytest.raises(Conflict):
        ocs_app.changes.change(plan, "circuits", "refused")
    assert not ctx.lock.locked() and ctx.circuits == INITIAL and device(ocs) == pairs(INITIAL)


def test_busy_when_the_lock_is_held_and_wait_is_zero(tmp_path):
    ctx, ocs_app, _, _ = make(tmp_path)
    with ctx.lock:
        with pytest.raises(Busy):
            ocs_app.changes.change(lambda current: SWAPPED, "circuits", "test", wait=0)
        with pytest.raises(Busy):
            ocs_app.changes.change(lambda current: SWAPPED, "circuits", "test", wait=0.05)


def test_the_version_survives_a_restart(tmp_path):
    ctx, ocs_app, _, _ = make(tmp_path)
    ocs_app.changes.change(lambda current: SWAPPED, "circuits", "test")
    version = ctx.circuits_version
    ctx2, _, _, _ = make(tmp_path)
    assert ctx2.circuits == SWAPPED and ctx2.circuits_version == version


def test_a_placement_plans_from_the_map_it_applies_to(tmp_path):
    """The lost update of issue 16: a PUT that finished while a job waited for the lock stays in force."""
    ctx, ocs_app, placement, ocs = make(tmp_path)
    ctx.lock.acquire()  # another reconfiguration is under way
    try:
        job = placement.submit(req(gpus=["gpu1", "gpu3"], policy="regroup"))
        wait_until(lambda: job.state == "configuring", what="the job to wait for the lock")
        hub.sleep(0.05)
        ocs_app.changes._reconfigure(SWAPPED, "circuits", "a PUT that finishes first", None, "")
    finally:
        ctx.lock.release()
    wait_until(lambda: job.state == "running", what="the job to run")
    for a, b in (("ocs1:5", "ocs1:22"), ("ocs1:6", "ocs1:12")):
        assert [a, b] in ctx.circuits.to_json(), f"the PUT's circuit {a}-{b} was undone"
    ev = ctx.events.get(job.events[-1])
    gpu_ports = {str(RACK.gpu_port(g)) for g in job.gpus}
    assert all(set(c) & gpu_ports for c in ev.removed + ev.added)  # only the job's GPUs' circuits
    assert ev.note == ""  # free ports were taken, no idle GPU moved
    assert device(ocs) == pairs(ctx.circuits)
    placement.stop(job.id)


def test_a_regroup_takes_free_ports_and_touches_no_other_gpu(tmp_path):
    ctx, ocs_app, placement, ocs = make(tmp_path)
    job = placement.submit(req(gpus=["gpu1", "gpu3"], policy="fixed"))
    wait_until(lambda: job.state == "running")
    ocs_app.changes.change(lambda current: SWAPPED, "circuits", "PUT")
    ev, _ = placement.regroup(job.id)
    assert ev.note == "" and len(job.switches) == 1
    for g in ("gpu2", "gpu4", "gpu5", "gpu6"):
        assert ctx.circuits.partner(RACK.gpu_port(g)) == SWAPPED.partner(RACK.gpu_port(g))
    assert device(ocs) == pairs(ctx.circuits)
    placement.stop(job.id)


def test_a_regroup_moves_an_idle_gpu_only_when_no_port_is_free_and_says_so(tmp_path):
    rack = tight_rack()
    ctx, _, placement, ocs = make(tmp_path, rack)
    job = placement.submit(req(gpus=["gpu1", "gpu3"], policy="fixed"))
    wait_until(lambda: job.state == "running")
    ev, _ = placement.regroup(job.id)
    assert "no free switch port" in ev.note and "gpu5's circuit ocs1:5-ocs1:12" in ev.note
    moved = {g for g in ("gpu2", "gpu4", "gpu5", "gpu6")
             if ctx.circuits.partner(rack.gpu_port(g)) != INITIAL.partner(rack.gpu_port(g))}
    assert moved == {"gpu5"}  # one idle GPU gave up its circuit, nothing else moved
    assert device(ocs) == pairs(ctx.circuits)
    placement.stop(job.id)


def _put(ctx, circuits, headers=None):
    from ryu.app.wsgi import WSGIApplication  # after controller.apps made it importable

    app_ = WSGIApplication()
    app_.register(Api, {"optirack": ctx})
    app_.register(NotFound, {"optirack": ctx})
    h = {"Authorization": f"Bearer {ctx.token}", **(headers or {})}
    return Request.blank("/api/v1/ocs/circuits", method="PUT", body=json.dumps({"circuits": circuits}).encode(),
                         headers=h).get_response(app_)


def test_put_checks_protected_ports_under_the_lock(tmp_path):
    """A job admitted while a PUT waited for the lock protects its circuits from that PUT."""
    ctx, _, placement, ocs = make(tmp_path)
    without_gpu3 = [c for c in INITIAL.to_json() if "ocs1:3" not in c]
    result = {}
    ctx.lock.acquire()
    try:
        thread = hub.spawn(lambda: result.setdefault("resp", _put(ctx, without_gpu3)))
        hub.sleep(0.05)  # the PUT now waits for the lock, its body parsed
        job = placement.submit(req(gpus=["gpu3", "gpu4"], policy="fixed"))
    finally:
        ctx.lock.release()
    thread.wait()
    resp = result["resp"]
    assert resp.status_int == 409, resp.body
    assert "carries job " + job.id in json.loads(resp.body)["error"]["message"]
    assert ctx.circuits == INITIAL and device(ocs) == pairs(INITIAL)
    wait_until(lambda: job.state == "running")
    placement.stop(job.id)


def _get(ctx):
    from ryu.app.wsgi import WSGIApplication

    app_ = WSGIApplication()
    app_.register(Api, {"optirack": ctx})
    return Request.blank("/api/v1/ocs/circuits").get_response(app_)


def test_the_circuit_map_carries_its_version_as_an_etag(tmp_path):
    ctx, _, _, ocs = make(tmp_path)
    got = _get(ctx)
    etag = got.headers["ETag"]
    assert etag == f'"{ctx.circuits_version}"' and json.loads(got.body)["version"] == ctx.circuits_version
    swapped = SWAPPED.to_json()
    resp = _put(ctx, swapped, {"If-Match": etag})
    assert resp.status_int == 200, resp.body
    new = resp.headers["ETag"]
    assert new != etag and json.loads(resp.body)["version"] == int(new.strip('"')) == ctx.circuits_version
    # a PUT made from the older version is refused, and changes nothing
    resp = _put(ctx, INITIAL.to_json(), {"If-Match": etag})
    err = json.loads(resp.body)["error"]
    assert resp.status_int == 409 and err["field"] == "If-Match" and "changed since version" in err["message"]
    assert ctx.circuits == SWAPPED and device(ocs) == pairs(SWAPPED)
    # a version never issued: 412; not an ETag: 400; "*" or no header: applies to the map as it is
    future = f'"{ctx.circuits_version + 5}"'
    assert _put(ctx, INITIAL.to_json(), {"If-Match": future}).status_int == 412
    bad = _put(ctx, INITIAL.to_json(), {"If-Match": "yesterday"})
    assert bad.status_int == 400 and json.loads(bad.body)["error"]["field"] == "If-Match"
    assert ctx.circuits == SWAPPED
    assert _put(ctx, INITIAL.to_json(), {"If-Match": f'"1", {new}'}).status_int == 200  # a list: any may match
    assert _put(ctx, swapped, {"If-Match": "*"}).status_int == 200
    assert _put(ctx, INITIAL.to_json()).status_int == 200 and ctx.circuits == INITIAL
    same = _put(ctx, INITIAL.to_json())
    assert same.status_int == 200 and json.loads(same.body)["event"] is None  # nothing to change: no event


def test_if_match_is_checked_under_the_lock(tmp_path):
    """A PUT that read version v, then waited while another change committed, is refused."""
    ctx, ocs_app, _, ocs = make(tmp_path)
    etag = _get(ctx).headers["ETag"]
    result = {}
    ctx.lock.acquire()
    try:
        thread = hub.spawn(lambda: result.setdefault("resp", _put(ctx, INITIAL.to_json()[:5], {"If-Match": etag})))
        hub.sleep(0.05)
        ocs_app.changes._reconfigure(SWAPPED, "circuits", "another client's change", None, "")
    finally:
        ctx.lock.release()
    thread.wait()
    assert result["resp"].status_int == 409
    assert ctx.circuits == SWAPPED and device(ocs) == pairs(SWAPPED)

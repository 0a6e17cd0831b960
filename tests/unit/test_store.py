"""The SQLite state: one transaction per change, paging, pruning, the legacy file, and kill -9 at any moment."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from controller.core.rack import load_rack
from controller.store import Store, StoreError
from tests.unit.fakes import FakeDriver, wait_until
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)


def job_state(i: int, state: str = "done", ended: float | None = 100.0) -> dict:
    return {"id": f"job-{i}", "request": {"gpus": 1, "policy": "fixed", "workload": {}}, "state": state,
            "gpus": ["gpu1"], "created_at": float(i), "ended_at": ended}


def test_save_writes_only_what_it_is_given_in_one_transaction(tmp_path):
    store = Store(tmp_path / "state.db")
    store.save(
        meta={"rack": "paper", "circuits": [["ocs1:1", "ocs1:11"]], "circuits_version": 3},
        jobs=[job_state(1), job_state(2, "running", None)],
        events=[{"id": 1, "requested_at": 5.0, "status": "ok"}],
    )
    store.save(jobs=[job_state(2, "failed")])  # one job changed: one row rewritten, the others untouched
    state = store.load()
    assert state["circuits_version"] == 3 and [j["state"] for j in state["jobs"]] == ["done", "failed"]
    with pytest.raises(ZeroDivisionError):
        with store._transaction() as db:  # a change that fails half-way leaves nothing behind
            db.execute("DELETE FROM jobs")
            raise ZeroDivisionError
    assert len(store.load()["jobs"]) == 2
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_legacy_state_json_is_imported_once(tmp_path):
    legacy = tmp_path / "state.json"
    legacy.write_text(json.dumps({"rack": "paper", "circuits": [["ocs1:1", "ocs1:11"]], "jobs": [job_state(7)]}))
    store = Store(tmp_path / "state.db", legacy=legacy, clock=lambda: 1234.0)
    assert store.load()["jobs"][0]["id"] == "job-7" and store.rack() == "paper"
    assert not legacy.exists() and (tmp_path / "state.json.migrated-1234").exists()
    bad = tmp_path / "other" / "state.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    with pytest.raises(StoreError, match="not valid JSON.*move it away"):
        Store(bad.with_name("state.db"), legacy=bad)


def test_a_damaged_database_is_named(tmp_path):
    (tmp_path / "state.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="state.db.*move it away"):
        Store(tmp_path / "state.db")


# --- the controller on the store ------------------------------------------------------------------


def _apps(tmp_path, driver=None):
    from tests.unit.test_change import make

    return make(tmp_path, driver=driver or FakeDriver())


def test_jobs_events_and_ids_survive_a_restart_and_an_event_cut_short_ends_failed(tmp_path):
    from controller.apps.context import Optirack
    from controller.core.jobs import JobRequest

    ctx, ocs_app, placement, _ = _apps(tmp_path)
    job = placement.submit(
        JobRequest.model_validate({"gpus": ["gpu1", "gpu3"], "policy": "regroup", "workload": {"iterations": 2}})
    )
    wait_until(lambda: job.state == "done")
    ev = ctx.events.start("circuits", "cut short by a kill", ctx.clock())
    ctx.record_event(ev)  # as if the controller died in the middle of this change
    ctx2 = Optirack(rack=RACK, state_dir=tmp_path)
    cut = ctx2.events.get(ev.id)
    assert cut.status == "failed" and "stopped before" in cut.error
    assert ctx2.events.start("circuits", "next", 0.0).id == ev.id + 1  # ids go on; job.events stay meaningful
    assert [j["id"] for j in ctx2.saved["jobs"]] == [job.id] and ctx2.saved["jobs"][0]["state"] == "done"
    assert ctx2.circuits_version == ctx.circuits_version


def test_a_state_of_another_rack_is_moved_aside(tmp_path):
    from controller.apps.context import Optirack

    Store(tmp_path / "state.db").save(meta={"rack": "elsewhere"}, jobs=[job_state(1)])
    ctx = Optirack(rack=RACK, state_dir=tmp_path)
    assert "jobs" not in ctx.saved
    assert [p.name for p in tmp_path.glob("state-elsewhere-*.db")]


def _api(ctx):
    from ryu.app.wsgi import WSGIApplication

    from controller.apps.jobs_api import JobsApi
    from controller.apps.rest import Api

    app = WSGIApplication()
    app.register(Api, {"optirack": ctx})
    app.register(JobsApi, {"optirack": ctx})
    return app


def _call(app, path, method="GET", body=None, token=None):
    from webob import Request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = Request.blank(
        path, method=method, body=json.dumps(body).encode() if body is not None else b"", headers=headers
    ).get_response(app)
    return resp.status_int, json.loads(resp.body)


def test_jobs_and_events_page_and_old_jobs_are_pruned(tmp_path):
    from controller.core.jobs import Job

    ctx, ocs_app, placement, _ = _apps(tmp_path)
    now = ctx.clock()
    for i in range(1, 26):
        job = Job(
            id=f"job-{i}",
            request={"gpus": 1, "policy": "fixed"},
            state="done",
            created_at=now - 1000 + i,
            ended_at=now - 1000 + i,
        )
        placement.jobs[job.id] = job
        placement.book.save(job)
    app = _api(ctx)
    status, page = _call(app, "/api/v1/jobs?limit=10")
    assert status == 200 and [j["id"] for j in page["jobs"]] == [f"job-{i}" for i in range(16, 26)]
    status, older = _call(app, f"/api/v1/jobs?limit=10&before={page['older']}")
    assert [j["id"] for j in older["jobs"]] == [f"job-{i}" for i in range(6, 16)] and older["older"] == "job-6"
    status, last = _call(app, "/api/v1/jobs?limit=10&before=job-6")
    assert len(last["jobs"]) == 5 and last["older"] is None
    assert _call(app, "/api/v1/jobs?state=running")[1]["jobs"] == []
    assert _call(app, "/api/v1/jobs?state=sleeping")[1]["error"]["field"] == "state"
    assert _call(app, "/api/v1/jobs?before=job-99")[1]["error"]["field"] == "before"

    for i in range(12):
        ocs_app.changes.change(lambda current, i=i: current if i % 2 else None, "circuits", "noop")  # no event
        ev = ctx.events.start("circuits", f"test {i}", now - 500 + i)
        ev.status = "ok"
        ctx.record_event(ev)
    status, events = _call(app, "/api/v1/events?limit=5")
    ids = [e["id"] for e in events["events"]]
    assert len(ids) == 5 and ids == sorted(ids) and events["older"] == ids[0]
    status, before = _call(app, f"/api/v1/events?limit=5&before={ids[0]}")
    assert [e["id"] for e in before["events"]] == list(range(ids[0] - 5, ids[0]))

    assert _call(app, "/api/v1/jobs/prune", "POST", {"keep": 3})[0] == 401
    status, err = _call(app, "/api/v1/jobs/prune", "POST", {}, ctx.token)
    assert status == 400 and "older_than_s" in err["error"]["message"]
    status, body = _call(app, "/api/v1/jobs/prune", "POST", {"older_than_s": 990, "keep": 20}, ctx.token)
    assert status == 200 and body["pruned"] == ["job-1", "job-2", "job-3", "job-4", "job-5"]  # job-6+ ended < 990 s ago
    status, body = _call(app, "/api/v1/jobs/prune", "POST", {"keep": 3, "older_than_s": 0, "events": True}, ctx.token)
    assert len(body["pruned"]) == 17 and body["events_pruned"] >= 12
    assert [j["id"] for j in ctx.store.load()["jobs"]] == ["job-23", "job-24", "job-25"] == list(placement.jobs)


def test_the_cli_parses_durations_and_refuses_nothing_to_prune():
    from controller.cli import main
    from controller.cli_jobs import _duration

    assert _duration("90") == 90 and _duration("15m") == 900 and _duration("7d") == 7 * 86400
    with pytest.raises(SystemExit, match="give --older-than, --keep"):
        main(["prune"])


# --- kill -9 during saves -----------------------------------------------------------------------------

WRITER = """
import sys
from controller.store import Store
store = Store(sys.argv[1])
n = (store.load().get("counter") or 0)
print("ready", flush=True)
while True:
    n += 1
    job = {"id": f"job-{n}", "state": "done" if n % 3 else "running", "ended_at": float(n), "payload": "x" * (n % 500)}
    # one change: the counter, a new job, an update of an older job, and an event, in one transaction
    older = {"id": f"job-{max(1, n - 7)}", "state": "failed", "ended_at": float(n), "touched_by": n}
    store.save(meta={"counter": n}, jobs=[job, older] if n > 7 else [job],
               events=[{"id": n, "requested_at": float(n), "status": "ok"}])
"""


def test_kill_9_during_saves_always_leaves_a_state_that_loads(tmp_path):
    """A writer saves as fast as it can; it is killed with SIGKILL at random moments, 25 times. After
    each kill the store opens, passes SQLite's integrity check, and holds whole transactions only:
    the counter, the newest job and the newest event always agree."""
    path = tmp_path / "state.db"
    rng = random.Random(16)
    counters = []
    for _ in range(25):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        store = Store(path)
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        state = store.load()
        n = state.get("counter", 0)
        jobs = {j["id"]: j for j in state.get("jobs", [])}
        assert len(jobs) == n and (n == 0 or f"job-{n}" in jobs)
        assert store.last_event_id() == n
        if n > 7:
            assert jobs[f"job-{n - 7}"]["touched_by"] == n  # the update made in the same transaction is there
        counters.append(n)
        store.close()
    assert counters == sorted(counters) and counters[-1] > counters[0]  # every run went on from the last
    print(f"25 kills; saves committed before each kill went from {counters[0]} to {counters[-1]}")


def test_a_save_writes_the_live_jobs_not_the_history():
    from controller.core.jobs import Job, JobTable

    old = [Job(id=f"job-{i}", request={}, state="done") for i in range(1, 4)]
    table = JobTable([*old, Job(id="job-4", request={}, state="running")])
    assert [j.id for j in table.to_save()] == ["job-4"]  # loaded: only the active one may change
    table["job-5"] = Job(id="job-5", request={}, state="pending")
    assert [j.id for j in table.to_save()] == ["job-4", "job-5"]
    table["job-4"].state = "done"
    written = table.to_save()
    table.saved(written)  # job-4 was written in its final state: not again
    assert [j.id for j in table.to_save()] == ["job-5"]
    assert [j.id for j in table.to_save(table["job-2"])] == ["job-5", "job-2"]  # a finished job named explicitly
    del table["job-5"]
    assert table.to_save() == [] and list(table) == ["job-1", "job-2", "job-3", "job-4"]

"""Fault injection at each step of a job's life: every job ends, nothing is held or left behind.

Each test breaks one step (the engine, a container, the NIC hand-over, the OCS, the switches,
the worker, or a plain bug inside the step) and then checks the same things: the job failed
with the reason, its GPUs are free, no container is left, no event is still running, the lock
is free, and the circuits (held and on the fake OCS) and the switches' flows are as before. On virtual time
(tests/unit/virtual.py): the wall clock's sleeps raise.
"""
from __future__ import annotations

import json

import pytest

from controller.apps.context import Optirack
from controller.apps.fabric import FabricApp
from controller.apps.inventory import Inventory
from controller.apps.ocs import OcsApp
from controller.apps.placement import PlacementApp
from controller.core import placement as policy
from controller.core.forwarding import compute_tables
from controller.core.jobs import JobRequest
from controller.core.rack import load_rack
from controller.jobs.ports import ContainerError, EngineDown
from tests.unit.fakes import FakeDriver, FakeSwitch
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)
SPREAD = ["gpu1", "gpu2", "gpu3", "gpu4"]  # under both switches: a regroup job changes circuits


class Rig:
    def __init__(self, tmp_path, driver, rt):
        self.rt = rt
        driver.sleep = rt.sleep
        self.ctx = ctx = Optirack(rack=RACK, state_dir=tmp_path, clock=rt.clock, runtime=rt, containers=driver)
        self.ocs_app = OcsApp(optirack=ctx)
        apps = [Inventory(optirack=ctx), self.ocs_app, FabricApp(optirack=ctx)]
        self.fabric = ctx.fabric  # the switches' keeper the wiring built
        self.driver = driver
        self.placement = PlacementApp(optirack=ctx).service
        self.ocs = FakeSwitch(0x100, apps, rt=rt)
        self.switches = {"as1": FakeSwitch(0x201, apps, rt=rt), "as2": FakeSwitch(0x202, apps, rt=rt)}
        for dp in [self.ocs, *self.switches.values()]:
            dp.connect()
        rt.run(lambda: "ocs1" in self.ocs_app.synchronised and not ctx.lock.locked()
                   and set(self.fabric.installed) == {"as1", "as2"}, what="the rack synchronised")
        self.before = ctx.circuits

    def submit(self, gpus=SPREAD, policy_="regroup", iterations=3):
        return self.placement.submit(JobRequest.model_validate(
            {"gpus": gpus, "policy": policy_, "workload": {"iterations": iterations}}))

    def wait_end(self, job, timeout=10.0):
        self.rt.run(lambda: not job.active, timeout, what=f"{job.id} to end")
        return job

    def tables_hold(self) -> bool:
        tables = compute_tables(RACK, self.ctx.circuits)
        for name, sw in self.switches.items():
            for ip, port in tables[name].items():
                if sw.output(eth_type=0x0800, ipv4_dst=ip) != port or sw.output(eth_type=0x0806, arp_tpa=ip) != port:
                    return False
        return True

    def assert_clean(self, job, reason: str, circuits_back: bool = True):
        assert job.state == "failed", (job.state, job.reason)
        assert reason in job.reason, job.reason
        assert self.placement.busy_gpus() == {}, "GPUs still held"
        assert self.driver.running == {}, f"containers left behind: {list(self.driver.running)}"
        running = [e.to_json() for e in self.ctx.events.recent() if e.status == "running"]
        assert running == [], running
        assert not self.ctx.lock.locked()
        if circuits_back:
            assert self.ctx.circuits == self.before
        assert self.ocs.circuits() == {(a.port, b.port) for a, b in self.ctx.circuits.circuits}
        self.rt.run(self.tables_hold, what="the switches' flows to match the circuits")
        saved = self.ctx.store.load()
        assert {j["id"]: j["state"] for j in saved["jobs"]}[job.id] == "failed"  # persisted as it ended


@pytest.mark.parametrize("fault, reason", [
    ({"client": EngineDown("srv1", "tcp://198.19.0.1:2376", "Connection refused")}, "Connection refused"),
    ({"start": {"gpu3": ContainerError("cannot start the container of gpu3: no such image")}}, "no such image"),
    ({"start": {"gpu2": ContainerError("srv2: optirack-nic add exited 4: no interface gpu2 on this server")}},
     "no interface gpu2"),
    ({"start": {"gpu4": KeyError("Pid")}}, "KeyError: 'Pid'"),
], ids=["engine-unreachable", "container-create", "nic-hand-over", "bug-in-start"])
def test_a_container_step_that_fails_fails_the_job_and_undoes_the_placement(tmp_path, fault, reason, vrt):
    rig = Rig(tmp_path, FakeDriver(faults=fault), vrt)
    job = rig.wait_end(rig.submit())
    rig.assert_clean(job, reason)
    assert len(job.events) == 2  # placed, then undone
    assert [rig.ctx.events.get(e).status for e in job.events] == ["ok", "ok"]


def test_the_ocs_refuses(tmp_path, vrt):
    rig = Rig(tmp_path, FakeDriver(), vrt)
    rig.ocs.refuse_flow_mods = True
    job = rig.wait_end(rig.submit())
    rig.ocs.refuse_flow_mods = False
    rig.assert_clean(job, "refused")
    assert rig.ctx.events.get(job.events[0]).status == "failed" if job.events else True
    assert rig.ctx.events.recent()[-1].status == "failed" and rig.driver.started == []


def test_the_switches_do_not_confirm_the_flows(tmp_path, vrt):
    rig = Rig(tmp_path, FakeDriver(), vrt)
    rig.fabric.timeout = 0.2
    rig.switches["as1"].silent = True
    job = rig.submit()
    rig.wait_end(job)
    assert "did not confirm" in rig.ctx.events.recent()[-1].error
    rig.switches["as1"].silent = False  # it answers again: the fabric resynchronises it by itself
    rig.rt.run(lambda: "as1" in rig.fabric.installed, 10, "as1 resynchronised")
    rig.assert_clean(job, "did not confirm")


def test_the_worker_exits_non_zero_and_its_last_lines_are_kept(tmp_path, vrt):
    driver = FakeDriver(exit_codes={"gpu2": 3}, stderr={"gpu2": ["Traceback (most recent call last):",
                                                                   "RuntimeError: NCCL error: unhandled system error"]})
    rig = Rig(tmp_path, driver, vrt)
    job = rig.wait_end(rig.submit())
    rig.assert_clean(job, "the worker on gpu2 exited with 3", circuits_back=False)  # it ran: circuits kept
    assert job.logs["gpu2"][-1] == "RuntimeError: NCCL error: unhandled system error"
    assert any('"event": "iteration"' in line for line in job.logs["gpu1"])
    lines, source = rig.placement.logs(job, tail=1)
    assert source == "kept when the job ended" and lines["gpu2"] == ["RuntimeError: NCCL error: unhandled system error"]


def test_a_bug_in_planning(tmp_path, monkeypatch, vrt):
    rig = Rig(tmp_path, FakeDriver(), vrt)
    real, calls = policy.plan, []

    def broken(*a, **kw):
        calls.append(1)
        if len(calls) == 1:  # admission plans too (to place the job or queue it); the bug is in the job's thread
            return real(*a, **kw)
        raise KeyError("gpu9")

    monkeypatch.setattr(policy, "plan", broken)
    job = rig.wait_end(rig.submit())
    rig.assert_clean(job, "KeyError: 'gpu9'")
    assert job.events == [] and rig.driver.started == []


def test_a_bug_in_the_ocs_driver_closes_the_event_and_rolls_back(tmp_path, monkeypatch, vrt):
    rig = Rig(tmp_path, FakeDriver(), vrt)

    def broken(remove, add, on_dark=None):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(rig.ocs_app.drivers["ocs1"], "apply", broken)
    job = rig.wait_end(rig.submit())
    rig.assert_clean(job, "ZeroDivisionError")
    ev = rig.ctx.events.recent()[-1]
    assert ev.status == "failed" and "internal error: ZeroDivisionError" in ev.error


def test_a_bug_in_the_fabric_closes_the_event_and_rolls_back(tmp_path, monkeypatch, vrt):
    rig = Rig(tmp_path, FakeDriver(), vrt)
    def broken(circuits):
        raise AttributeError("'NoneType' object has no attribute 'send_msg'")

    monkeypatch.setattr(rig.fabric, "add_new", broken)  # the change's programming; the rollback's sync still works
    job = rig.wait_end(rig.submit())
    rig.assert_clean(job, "AttributeError")


def test_a_bug_while_following_the_workers(tmp_path, monkeypatch, vrt):
    rig = Rig(tmp_path, FakeDriver(block=True), vrt)

    from controller.jobs.inbox import WorkerLine

    def broken(event):
        raise TypeError("bad log line")

    rig.placement.loop.handlers[WorkerLine] = [broken]  # the step that takes a worker's line has a bug
    job = rig.wait_end(rig.submit())
    rig.assert_clean(job, "TypeError: bad log line", circuits_back=False)


def test_nothing_of_a_failed_job_blocks_the_next(tmp_path, vrt):
    rig = Rig(tmp_path, FakeDriver(faults={"start": {"gpu3": ContainerError("no such image")}}), vrt)
    rig.wait_end(rig.submit())
    rig.driver.faults = {}
    job = rig.wait_end(rig.submit())
    assert job.state == "done", job.reason


def test_logs_of_a_failed_job_over_rest(tmp_path, vrt):
    from ryu.app.wsgi import WSGIApplication
    from webob import Request

    from controller.apps.jobs_api import JobsApi

    rig = Rig(tmp_path, FakeDriver(exit_codes={"gpu1": 1}, stderr={"gpu1": ["ValueError: no"]}), vrt)
    job = rig.wait_end(rig.submit(gpus=["gpu1", "gpu2"], policy_="fixed"))
    app = WSGIApplication()
    app.register(JobsApi, {"optirack": rig.ctx})
    body = json.loads(Request.blank(f"/api/v1/jobs/{job.id}/logs?tail=2").get_response(app).body)
    assert body["state"] == "failed" and body["logs"]["gpu1"][-1] == "ValueError: no" and len(body["logs"]["gpu1"]) == 2
    resp = Request.blank(f"/api/v1/jobs/{job.id}/logs?tail=0").get_response(app)
    assert resp.status_int == 400 and json.loads(resp.body)["error"]["field"] == "tail"


def test_each_ocs_is_confirmed_once_read_back_before_the_circuits_are_kept(tmp_path, monkeypatch, vrt):
    """The change confirms an OCS's change (NETCONF's confirmed commit) after its apply returned, and keeps the new
    circuits only after the confirm."""
    rig = Rig(tmp_path, FakeDriver(), vrt)
    driver, order = rig.ocs_app.drivers["ocs1"], []
    apply = driver.apply

    def applied(remove, add, on_dark=None):
        result = apply(remove, add, on_dark)
        order.append("apply")
        return result

    monkeypatch.setattr(driver, "apply", applied)
    monkeypatch.setattr(driver, "confirm", lambda: order.append(("confirm", rig.ctx.circuits == rig.before)))
    job = rig.wait_end(rig.submit())
    assert job.state == "done" and order[:2] == ["apply", ("confirm", True)], order


def test_a_refused_confirm_fails_the_change_and_puts_the_ocs_back(tmp_path, monkeypatch, vrt):
    from controller.drivers.errors import NetconfError

    rig = Rig(tmp_path, FakeDriver(), vrt)
    driver, cancelled = rig.ocs_app.drivers["ocs1"], []

    def refused():
        raise NetconfError("OCS ocs1: confirming commit (ports 1, 2 refused: operation-failed: no commit pending)")

    monkeypatch.setattr(driver, "confirm", refused)
    monkeypatch.setattr(driver, "cancel", lambda: cancelled.append(True) or False)
    job = rig.wait_end(rig.submit())
    rig.assert_clean(job, "confirming commit")
    assert cancelled  # the rollback asks the device to undo an unconfirmed change first

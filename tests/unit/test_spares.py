"""The one rule for spare GPUs (controller/core/spares.py), and the controller's fail-over choosing through it."""

from __future__ import annotations

import pytest

from controller.core import spares
from controller.core.placement import NoRoomNow
from controller.core.rack import load_rack
from tests.unit.jobfakes import FakeDriver
from tests.unit.test_jobs import finished, make, req
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)  # gpu1-gpu4 M40, gpu5-gpu6 Titan V; gpu1,2,5 under as1 and gpu3,4,6 under as2 at the start


def test_the_lost_gpus_model_first_then_the_jobs_switch_then_the_fastest_then_the_name():
    where = {"gpu1": "as1", "gpu2": "as1", "gpu3": "as2", "gpu4": "as2", "gpu5": "as1", "gpu6": "as2"}
    assert spares.choose(RACK, ["gpu1"], ["gpu3", "gpu4", "gpu5", "gpu6"], "vgg16", ["as1"], where) == {"gpu1": "gpu3"}
    assert spares.choose(RACK, ["gpu1"], ["gpu5", "gpu6"], "vgg16", ["as2"], where) == {"gpu1": "gpu6"}  # switch
    assert spares.choose(RACK, ["gpu5"], ["gpu1", "gpu6"], "vgg16", ["as1"], where) == {"gpu5": "gpu6"}  # model
    # the same model under no switch of the job: the faster of the others is not taken over the lost GPU's model
    assert spares.choose(RACK, ["gpu1"], ["gpu4", "gpu5"], "vgg16", ["as1"], {"gpu5": "as1"}) == {"gpu1": "gpu4"}
    two = spares.choose(RACK, ["gpu1", "gpu2"], ["gpu3", "gpu4", "gpu5"], "vgg16", ["as1"], where)
    assert two == {"gpu1": "gpu3", "gpu2": "gpu4"}  # each spare once, in rank order


def test_a_job_of_one_model_takes_only_that_model_and_too_few_is_no_room_now():
    where: dict = {}
    assert spares.choose(RACK, ["gpu1"], ["gpu5", "gpu4"], "vgg16", [], where, model="M40") == {"gpu1": "gpu4"}
    with pytest.raises(NoRoomNow, match=r"^2 spare GPU\(s\) of model M40 needed, 1 free$"):
        spares.choose(RACK, ["gpu1", "gpu2"], ["gpu4", "gpu5", "gpu6"], "vgg16", [], where, model="M40")
    with pytest.raises(NoRoomNow, match=r"^1 spare GPU\(s\) needed, 0 free$"):
        spares.choose(RACK, ["gpu1"], [], "vgg16", [], where)


def spy(monkeypatch) -> list:
    calls, real = [], spares.choose

    def choose(rack, lost, *args, **kwargs):
        out = real(rack, lost, *args, **kwargs)
        calls.append((list(lost), out))
        return out

    monkeypatch.setattr(spares, "choose", choose)
    return calls


def test_the_controller_chooses_its_spares_through_the_core_rule(tmp_path, vrt, monkeypatch):
    calls = spy(monkeypatch)
    driver = FakeDriver(pace=1.0)
    _, jobs, _ = make(tmp_path, driver, vrt)
    job = jobs.submit(req(gpus=["gpu1", "gpu2"], workload={"iterations": 12}, checkpoint_every=3))
    vrt.run(lambda: len(job.iterations()) >= 4, what="4 iterations")
    driver.kill_server("srv2")
    vrt.run(finished(jobs, job.id), what="the job to end")
    assert job.state == "done" and calls == [(["gpu2"], job.recoveries[0]["spares"])], (job.reason, calls)


def test_a_killed_workers_gpu_is_its_own_last_spare_of_its_model():
    where = {"gpu1": "as1", "gpu2": "as1", "gpu3": "as2", "gpu4": "as2", "gpu5": "as1", "gpu6": "as2"}
    # a free spare of its model is better than the suspect GPU, even under another switch
    assert spares.choose(RACK, ["gpu2"], ["gpu4", "gpu5"], "vgg16", ["as1"], where, own=["gpu2"]) == {"gpu2": "gpu4"}
    # none of its model: itself before a spare of another model, and before waiting for one
    assert spares.choose(RACK, ["gpu2"], ["gpu5", "gpu6"], "vgg16", ["as1"], where, own=["gpu2"]) == {"gpu2": "gpu2"}
    assert spares.choose(RACK, ["gpu2"], [], "vgg16", [], where, model="M40", own=["gpu2"]) == {"gpu2": "gpu2"}
    # the GPU that cannot fall back on itself has the spare, whatever the rank order
    two = spares.choose(RACK, ["gpu1", "gpu2"], ["gpu4"], "vgg16", ["as1"], where, model="M40", own=["gpu1"])
    assert two == {"gpu1": "gpu1", "gpu2": "gpu4"} and list(two) == ["gpu1", "gpu2"]
    with pytest.raises(NoRoomNow, match=r"^1 spare GPU\(s\) of model M40 needed, 0 free$"):
        spares.choose(RACK, ["gpu1", "gpu2"], ["gpu5"], "vgg16", [], where, model="M40", own=["gpu1"])


def test_only_a_first_death_by_a_signal_on_a_live_server_with_its_link_up_is_restartable():
    server_of = RACK.server_of
    lost = ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert spares.restartable(lost, ["gpu2"], [], [], server_of, []) == ["gpu2"]
    assert spares.restartable(lost, lost, [], [], server_of, []) == lost
    assert spares.restartable(lost, [], [], [], server_of, []) == []  # vanished or engine gone: not a kill
    assert spares.restartable(lost, ["gpu2"], [server_of["gpu2"]], [], server_of, []) == []  # its engine is down
    assert spares.restartable(lost, ["gpu2"], [], ["gpu2"], server_of, []) == []  # its NIC's link is down
    assert spares.restartable(lost, ["gpu2", "gpu3"], [], [], server_of, ["gpu2"]) == ["gpu3"]  # killed twice
    assert spares.restartable(["gpu3"], ["gpu2"], [], [], server_of, []) == []  # not lost: nothing to restart


def test_the_simulator_chooses_its_spares_through_the_same_rule(monkeypatch):
    """A job over two servers of a simulated rack loses one of them: its survivors stay, and the spares for the lost
    GPUs are the rule's."""
    from simulator.inputs.racks import RackOptions, generate
    from simulator.inputs.workloads import JobSpec
    from simulator.model.engine import Options, Run, policies, with_recovery
    from simulator.model.failures import FailureClock, Failures

    calls = spy(monkeypatch)
    script = iter([(150.0, "s1")])
    monkeypatch.setattr(FailureClock, "next", lambda self, t: next(script, (float("inf"), "s1")))
    rack = generate(RackOptions(32, gpus_per_switch=8, gpus_per_server=4, oversubscription=1,
                                models=(("V100", 1.0),), spare=1.0))
    policy = with_recovery(policies(300.0)["fixed"], "swap")
    f = Failures("swap", repair_s=1000.0, swap_s=10.0, restart_s=60.0, checkpoint_s=100.0)
    out = Run(rack, [JobSpec("a", 0.0, 8, "resnet50", 3000)], policy, Options(failures=f)).run()
    (a,) = out.jobs
    assert out.failures == 1 and a.interruptions == 1 and a.done == 3000
    on_s1 = [g for g in rack.gpus if rack.server_of[g] == "s1"]
    ((lost, chosen),) = calls
    assert sorted(lost) == sorted(on_s1) and set(chosen) == set(lost)  # one spare for each GPU of the dead server
    assert not set(a.placement) & set(on_s1) and set(chosen.values()) <= set(a.placement)
    survivors = set(a.placement) - set(chosen.values())
    assert len(survivors) == 4 and {rack.server_of[g] for g in survivors} == {"s2"}  # the survivors stayed

"""Recovery (controller/jobs/recovery.py) of the job service built alone, on virtual time, with a fake circuit-change
port and fake workers that train on the
runtime's clock (one iteration a second, a checkpoint line every K): a server's death, a NIC's link drop and a
killed worker are detected within 2 s, the lost GPUs swapped for spares under the job's switch in one circuit change,
and every rank goes on from the checkpoint; with no spare the job waits at the head of the queue."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controller.core.jobs import DEFAULT_CHECKPOINT_EVERY, JobRequest
from controller.core.perf import iteration_seconds
from controller.core.rack import PortRef
from controller.jobs import recovery
from profiles import WORKLOADS
from tests.unit.jobfakes import FakeDriver
from tests.unit.test_jobs import RACK, finished, make, req

PACE = 1.0  # virtual seconds per iteration of the fake workers


def job_of(placement, gpus, iterations=30, every=5, **kw):
    return placement.submit(req(gpus=gpus, workload={"iterations": iterations}, checkpoint_every=every, **kw))


def cmd_of(driver, job, gpu, attempt=-1):
    return [c for j, g, c in driver.started if j == job.id and g == gpu][attempt]


def test_a_dead_server_is_detected_and_its_gpu_swapped_for_a_spare_under_the_jobs_switch(tmp_path, vrt):
    driver = FakeDriver(pace=PACE)
    ctx, placement, ocs = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"])
    vrt.run(lambda: len(job.iterations()) >= 12, what="12 iterations")
    (switch,) = job.switches
    killed_at = vrt.clock()
    driver.kill_server("srv2")
    vrt.run(lambda: job.state == "recovering", what="the job to recover")
    assert vrt.clock() - killed_at <= 2.0 and "srv2" in job.reason, job.reason
    vrt.run(finished(placement, job.id), what="the job to end")
    assert job.state == "done", job.reason
    (rec,) = job.recoveries
    assert rec["lost"] == {"gpu2": rec["lost"]["gpu2"]} and "srv2" in rec["lost"]["gpu2"]
    spare = rec["spares"]["gpu2"]
    assert RACK.server_of[spare] != "srv2" and spare in job.gpus and "gpu2" not in job.gpus
    assert rec["detected_at"] - killed_at <= 2.0
    assert rec["resumed_from"] == 10 and 0 <= rec["iterations_redone"] <= 5  # K = 5
    assert job.switches == [switch] and spare == "gpu5"  # a spare already under as1
    fence = ctx.events.get(rec["event"])  # the one change: the lost GPU's circuit taken away (fenced), nothing added
    assert fence.kind == "failover" and fence.added == [] and [c[0] for c in fence.removed] == ["ocs1:2"], fence
    where = ctx.circuits.gpu_locations(RACK)
    assert {where[g][0] for g in job.gpus} == {switch}
    # every rank restarted from iteration 10: the survivors from their own copy, the spare from a survivor's
    for g in job.gpus:
        cmd = cmd_of(driver, job, g)
        assert cmd[cmd.index("--resume-from") + 1] == "10"
        source = cmd[cmd.index("--restore-from") + 1]
        assert source == "local" if g != spare else source in {RACK.addresses[s][0] for s in job.gpus if s != spare}
    assert [i["iteration"] for i in job.iterations()] == list(range(30))
    assert placement.busy_gpus() == {}
    driver.engines.back.add("srv2")  # the server answers again: swept, then its GPU is free, not the job's
    vrt.run(lambda: "srv2" not in placement.down_servers(), what="srv2 swept and up")
    assert not [c for c in driver.running.values() if c.labels["server"] == "srv2"]
    again = placement.submit(req(gpus=["gpu2"], workload={"iterations": 2}))
    vrt.run(finished(placement, again.id))
    assert again.state == "done"


def test_a_server_that_answers_again_is_shown_down_until_its_stale_containers_are_gone(tmp_path, vrt):
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2"], iterations=30)
    vrt.run(lambda: len(job.iterations()) >= 4, what="4 iterations")
    driver.kill_server("srv2")
    vrt.run(lambda: "gpu2" not in job.gpus, what="the loss to be seen and gpu2 swapped out")
    seen, sweep = [], driver.sweep

    def watched(server, *args):
        seen.append(dict(placement.down_servers()))  # what a caller asking then is told
        return sweep(server, *args)

    driver.sweep = watched
    driver.engines.back.add("srv2")
    vrt.run(lambda: seen and "srv2" not in placement.down_servers(), what="the engine's return and sweep")
    assert "srv2" in seen[0] and "stale containers" in seen[0]["srv2"], seen  # down while swept
    assert driver.engines.ping("srv2")
    assert "gpu2" not in job.gpus and not [c for c in driver.running.values() if c.labels["server"] == "srv2"]


def test_two_losses_one_after_the_other_are_both_recovered(tmp_path, vrt):
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"], iterations=40)
    vrt.run(lambda: len(job.iterations()) >= 8)
    driver.kill_server("srv2")
    vrt.run(lambda: len(job.recoveries) == 1 and job.state == "running")
    vrt.run(lambda: len(job.iterations()) >= 22)
    driver.kill_server("srv4")
    vrt.run(finished(placement, job.id))
    assert job.state == "done" and len(job.recoveries) == 2, job.reason
    first, second = job.recoveries
    assert set(first["lost"]) == {"gpu2"} and set(second["lost"]) == {"gpu4"}
    assert second["spares"] == {"gpu4": "gpu6"} and second["event"] is not None  # gpu6 moved from as2 to as1
    ev = next(e for e in ctx.events.recent() if e.id == second["event"])
    assert ev.kind == "failover" and "gpu4 -> gpu6" in ev.reason and len(ev.added) == 1
    assert second["resumed_from"] == 20 and len(set(job.gpus)) == 4 and not {"gpu2", "gpu4"} & set(job.gpus)
    assert len(job.switches) == 1


def test_a_link_drop_and_a_killed_worker_are_losses_too(tmp_path, vrt):
    driver = FakeDriver(pace=PACE)
    ctx, placement, ocs = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"])
    vrt.run(lambda: len(job.iterations()) >= 6)
    placement.link_changed(RACK.gpu_port("gpu3"), False)  # the OCS sees gpu3's NIC drop (test_apps: its handler)
    vrt.run(lambda: job.state == "recovering", what="the link's drop to be taken")
    assert "gpu3's NIC" in job.reason
    vrt.run(lambda: job.state == "running")
    assert set(job.recoveries[0]["lost"]) == {"gpu3"}
    vrt.run(lambda: len(job.iterations()) >= 12)
    victim = job.gpus[0]
    killed_at = vrt.clock()
    driver.kill9(job.id, victim, RACK.server_of[victim])  # exits 137 on its own: the controller did not stop it
    vrt.run(lambda: job.state == "recovering")
    assert vrt.clock() - killed_at <= 2.0 and "exited with 137" in job.reason
    vrt.run(finished(placement, job.id))
    assert job.state == "done" and set(job.recoveries[1]["lost"]) == {victim}
    placement.link_changed(PortRef("ocs1", 3), True)
    vrt.run(lambda: str(PortRef("ocs1", 3)) not in placement.book.links_down, what="the link back up")


def test_with_no_spare_the_job_waits_at_the_head_of_the_queue_and_goes_on_when_gpus_free(tmp_path, vrt):
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"])
    other = job_of(placement, ["gpu5", "gpu6"], iterations=1000)
    vrt.run(lambda: len(job.iterations()) >= 7 and other.state == "running")
    driver.kill_server("srv2")
    vrt.run(lambda: "waiting at the head of the queue" in job.note, what="the job to wait for a spare")
    assert job.state == "recovering" and job.gpus == ["gpu1", "gpu3", "gpu4"]
    later = placement.submit(req(gpus=1))  # would fit nowhere anyway, but must not overtake it
    assert later.state == "queued"
    vrt.advance(10)
    assert job.state == "recovering"
    placement.stop(other.id)
    vrt.run(finished(placement, job.id), what="the job to go on and end")
    assert job.state == "done" and job.recoveries[0]["spares"]["gpu2"] in ("gpu5", "gpu6")
    assert "waited_from" in job.recoveries[0]
    vrt.run(finished(placement, later.id))


def test_a_job_stopped_while_it_waits_for_a_spare_ends_stopped(tmp_path, vrt):
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"])
    other = job_of(placement, ["gpu5", "gpu6"], iterations=1000)
    vrt.run(lambda: len(job.iterations()) >= 3 and other.state == "running")
    driver.kill_server("srv4")
    vrt.run(lambda: "waiting" in job.note)
    placement.stop(job.id)
    assert job.state == "stopped" and placement.busy_gpus().keys() == {"gpu5", "gpu6"}
    placement.stop(other.id)


def test_a_worker_that_keeps_failing_fails_the_job_after_the_recoveries_allowed(tmp_path, vrt):
    driver = FakeDriver(exit_codes={"gpu2": 3})
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = placement.submit(req(gpus=["gpu1", "gpu2"], policy="fixed"))
    vrt.run(finished(placement, job.id))
    assert job.state == "failed" and "gpu2 exited with 3" in job.reason and "recoveries" in job.reason
    assert job.logs  # kept


def test_checkpoint_every_is_validated_and_its_default_costs_at_most_5_percent_on_the_paper_rack():
    for bad in (0, -3):
        with pytest.raises(ValidationError, match="checkpoint_every"):
            JobRequest.model_validate({"gpus": 2, "checkpoint_every": bad})
    # saving params + momentum (2 x the gradient) at the NIC's rate, every K iterations, over one iteration
    # (compute plus ring all-reduce, controller/core/perf.py) of every job size, model and workload of the rack
    worst = 0.0
    for workload, w in WORKLOADS.items():
        for model in {g.model for g in RACK.gpus.values()}:
            gpus = [g for g in RACK.gpus if RACK.gpus[g].model == model]
            for n in range(1, len(gpus) + 1):
                ring = gpus[:n]
                it = iteration_seconds(RACK, {"j": ring}, {g: "as1" for g in ring}, {"j": workload})["j"]
                save = 2 * w.gradient_bytes * 8 / (RACK.gpus[ring[0]].nic.rate_gbps * 1e9)
                worst = max(worst, save / (DEFAULT_CHECKPOINT_EVERY * it))
    assert 0.01 < worst <= 0.05, worst


def test_an_engine_that_stops_answering_while_its_workers_streams_hang_is_seen_by_the_poll(tmp_path, vrt):
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"])
    vrt.run(lambda: len(job.iterations()) >= 6)
    for c in driver.running.values():
        if c.labels["server"] == "srv4":
            c.pace = 3600.0  # its worker's stream hangs: no line, no error
    down_at = vrt.clock()
    driver.engines.down["srv4"] = "timed out"
    vrt.run(lambda: job.state == "recovering")
    assert vrt.clock() - down_at <= 2.0 and "srv4 went down (timed out)" in job.reason
    vrt.run(finished(placement, job.id))
    assert job.state == "done" and set(job.recoveries[0]["lost"]) == {"gpu4"}


def test_a_job_queued_behind_one_waiting_for_a_spare_starts_once_that_one_has_its_spare(tmp_path, vrt, monkeypatch):
    """The head of the queue: a job that waits for an M40 spare holds back a queued job that free Titan V would take;
    once an M40 frees and the waiting job has it, the queued one starts, while the first still runs (the waiting job
    tries again well after the freed GPU's job has ended and found the queue held back)."""
    monkeypatch.setattr(recovery, "WAIT_POLL", 5.0)
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3"], iterations=60, gpu_model="M40")
    other = job_of(placement, ["gpu4"], iterations=1000)
    vrt.run(lambda: len(job.iterations()) >= 7 and other.state == "running")
    driver.kill_server("srv2")
    vrt.run(lambda: "waiting at the head of the queue" in job.note, what="the job to wait for a spare")
    later = placement.submit(req(gpus=1, workload={"iterations": 3}))
    assert later.state == "queued" and "waiting for spares ahead of it" in later.note, later.note
    vrt.advance(5)
    assert later.state == "queued" and job.state == "recovering"  # gpu5 and gpu6 are free, but not for it
    placement.stop(other.id)
    vrt.run(lambda: later.state not in ("queued", "pending"), what="the queued job to start")
    assert job.state in ("recovering", "running") and "gpu4" in job.gpus  # it has its spare and goes on
    assert later.gpus[0] in ("gpu5", "gpu6")
    vrt.run(finished(placement, job.id))
    assert job.recoveries[0]["spares"] == {"gpu2": "gpu4"}
    vrt.run(finished(placement, later.id))
    assert job.state == "done" and later.state == "done", (job.reason, later.reason)


def test_a_spare_is_taken_only_once_the_stopped_job_holding_it_has_given_it_back(tmp_path, vrt, monkeypatch):
    """Stopping a job frees its GPUs once its containers are gone (their NICs home), not when it is marked stopped: a
    job waiting for a spare, trying every 0.5 s, starts its container on the freed GPU only after the removal."""
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    order = []
    remove, start = driver.remove, driver.start

    def slow_remove(job_id, gpu, server):
        vrt.sleep(3.0)  # a NIC handed back and two containers removed, slowly
        remove(job_id, gpu, server)
        order.append(("removed", job_id, gpu))

    def start_logged(spec, *a, **kw):
        order.append(("started", spec.job, spec.gpu))
        return start(spec, *a, **kw)

    monkeypatch.setattr(driver, "remove", slow_remove)
    monkeypatch.setattr(driver, "start", start_logged)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3"], iterations=40, gpu_model="M40")
    other = job_of(placement, ["gpu4"], iterations=1000)
    vrt.run(lambda: len(job.iterations()) >= 7 and other.state == "running")
    driver.kill_server("srv2")
    vrt.run(lambda: "waiting at the head of the queue" in job.note, what="the job to wait for a spare")
    placement.stop(other.id)
    vrt.run(finished(placement, job.id))
    assert job.state == "done" and job.recoveries[0]["spares"] == {"gpu2": "gpu4"}, job.reason
    assert order.index(("removed", other.id, "gpu4")) < order.index(("started", job.id, "gpu4")), order


def _its(gpus, iterations, attempt):
    return {g: [{"event": "iteration", "iteration": i, "attempt": attempt, "t_start": float(i), "t_end": i + 0.9,
                 "iter_s": 0.9, "compute_s": 0.5, "comm_s": 0.4, "gpu_util": 0.55} for i in iterations]
            for g in gpus}


def test_an_iteration_before_the_checkpoint_counts_though_the_killed_rank_s_report_of_it_died_with_its_server():
    """CI saw a job end done at 11 of 40 iterations: srv4 was killed after its rank finished iteration 11 but before
    its engine streamed that line; the job resumed from the checkpoint at 12, so no attempt held 11 on every rank."""
    from controller.core.jobs import Job

    job = Job(id="job-1", request={"gpus": 4, "workload": {"iterations": 16}}, state="done",
              gpus=["gpu1", "gpu3", "gpu7", "gpu8"])
    reports = _its(["gpu1", "gpu3", "gpu7"], range(0, 12), 1)  # attempt 1: gpu4's report of 11 never came
    reports["gpu4"] = _its(["gpu4"], range(0, 11), 1)["gpu4"]
    for g, rs in _its(job.gpus, range(12, 16), 2).items():
        reports.setdefault(g, []).extend(rs)
    job.reports = reports
    job.recoveries = [{"attempt": 2, "resumed_from": 12, "lost": {"gpu4": "srv4 went down"}}]
    assert [i["iteration"] for i in job.iterations()] == list(range(16))
    assert job.summary()["iterations_done"] == 16

    job.recoveries = [{"attempt": 2, "resumed_from": 8, "lost": {"gpu4": "srv4 went down"}}]  # no checkpoint after 11
    assert len(job.iterations()) == 11  # 11 has no attempt with every rank and nothing proves it: the count stops


def port_status_event(apps, ocs, port: int, down: bool):
    """The OCS's OpenFlow port-status message for one of its ports, delivered to the apps (test_apps: the OCS app
    hands it to the job service)."""
    from ryu.controller import ofp_event
    from ryu.ofproto import ofproto_v1_3 as ofp
    from ryu.ofproto import ofproto_v1_3_parser as parser

    from tests.unit.fakes import deliver

    desc = parser.OFPPort(port_no=port, hw_addr="00:00:00:00:00:01", name=f"p{port}", config=0,
                          state=ofp.OFPPS_LINK_DOWN if down else ofp.OFPPS_LIVE, curr=0, advertised=0, supported=0,
                          peer=0, curr_speed=0, max_speed=0)
    deliver(apps, ofp_event.ofp_msg_to_ev(parser.OFPPortStatus(ocs, reason=ofp.OFPPR_MODIFY, desc=desc)))


@pytest.mark.parametrize("step", ["detected", "assessed", "swapped"])
def test_a_controller_restarted_while_a_job_recovers_carries_the_recovery_on(tmp_path, vrt, step):
    """Recovery is state, not memory: the controller dies at each step of a recovery (held there by the fault hook);
    the new one finds the job `recovering`, carries its recovery on from the step its record says, and the job ends
    done, every iteration once, with one recovery: attempt 0 before it, attempt 1 after."""
    from tests.unit.virtual import VirtualRuntime

    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    placement.recovery.hold_at = step
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"], iterations=30)
    vrt.run(lambda: len(job.iterations()) >= 12, what="12 iterations")
    driver.kill_server("srv2")
    vrt.run(lambda: job.state == "recovering", what="the loss to be seen")
    vrt.advance(2)  # the recovery reaches the step it is held at
    assert job.state == "recovering" and job.recovery["step"] == step, job.recovery
    (saved,) = [j for j in ctx.store.load()["jobs"] if j["id"] == job.id]  # what a new controller will read
    assert saved["state"] == "recovering" and saved["recovery"]["step"] == step, saved["recovery"]
    rt2 = VirtualRuntime()  # the controller is killed; a new one starts on the same state and engines
    ctx2, placement2, _ = make(tmp_path, driver, rt2)
    again = placement2.get(job.id)
    rt2.run(finished(placement2, job.id), what="the job to end after the restart")
    assert again.state == "done", again.reason
    (rec,) = again.recoveries
    assert rec["attempt"] == again.attempt == 1 and set(rec["lost"]) == {"gpu2"} and "step" not in rec
    assert rec["resumed_from"] == 10 and again.recovery is None and "recovery" not in again.to_json()
    assert {r["attempt"] for rs in again.reports.values() for r in rs if r.get("event") == "iteration"} == {0, 1}
    assert [i["iteration"] for i in again.iterations()] == list(range(30))
    assert "gpu2" not in again.gpus and len(again.gpus) == 4 and placement2.busy_gpus() == {}
    assert {ctx2.circuits.gpu_locations(RACK)[g][0] for g in again.gpus} == set(again.switches)
    rt2.close()


def test_a_worker_killed_with_no_spare_of_its_model_free_is_restarted_on_its_own_gpu(tmp_path, vrt):
    """A killed worker is not a dead GPU: its server lives, its link is up, and no M40 is free: its rank starts again
    on its own GPU from the checkpoint, by the swap's path (the others restarted too), and the job ends done."""
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"], gpu_model="M40")
    vrt.run(lambda: len(job.iterations()) >= 12, what="12 iterations")
    before = list(job.gpus)
    driver.kill9(job.id, "gpu2", "srv2")
    vrt.run(lambda: job.state == "recovering", what="the job to recover")
    vrt.run(finished(placement, job.id), what="the job to end")
    assert job.state == "done", job.reason
    (rec,) = job.recoveries
    assert set(rec["lost"]) == {"gpu2"} and "exited with 137" in rec["lost"]["gpu2"]
    assert rec["restarted"] == {"gpu2": rec["lost"]["gpu2"]} and rec["spares"] == {}, rec
    assert job.gpus == before and "waited_from" not in rec  # its rank on its own GPU, nothing waited for
    assert rec["resumed_from"] == 10 and "gpu2 restarted on its own GPU" in job.note
    cmd = cmd_of(driver, job, "gpu2")
    assert cmd[cmd.index("--rank") + 1] == "1" and cmd[cmd.index("--resume-from") + 1] == "10"
    assert cmd[cmd.index("--restore-from") + 1] == "local"
    assert [i["iteration"] for i in job.iterations()] == list(range(30))


def test_a_gpu_whose_worker_is_killed_twice_is_set_aside(tmp_path, vrt):
    """The first kill restarts gpu2's rank on gpu2 (the only other M40 is busy); the second sets gpu2 aside: the job
    waits at the head of the queue for an M40 and takes gpu4 once the other job has given it back."""
    driver = FakeDriver(pace=PACE)
    ctx, placement, _ = make(tmp_path, driver, vrt)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3"], iterations=40, gpu_model="M40")
    other = job_of(placement, ["gpu4"], iterations=1000)
    vrt.run(lambda: len(job.iterations()) >= 7 and other.state == "running")
    driver.kill9(job.id, "gpu2", "srv2")
    vrt.run(lambda: len(job.recoveries) == 1 and job.state == "running", what="the first recovery")
    assert job.recoveries[0]["restarted"].keys() == {"gpu2"} and job.gpus == ["gpu1", "gpu2", "gpu3"]
    vrt.run(lambda: len(job.iterations()) >= 17, what="17 iterations")
    driver.kill9(job.id, "gpu2", "srv2")
    vrt.run(lambda: "waiting at the head of the queue" in job.note, what="the job to wait for a spare")
    assert "1 spare GPU(s) of model M40 needed, 0 free" in job.note and "gpu2" not in job.gpus
    placement.stop(other.id)
    vrt.run(finished(placement, job.id), what="the job to end")
    assert job.state == "done", job.reason
    second = job.recoveries[1]
    assert second["spares"] == {"gpu2": "gpu4"} and second["restarted"] == {} and "waited_from" in second
    assert job.gpus == ["gpu1", "gpu3", "gpu4"]


def test_survivors_keep_their_workers_and_the_jobs_warm_spare_takes_the_lost_rank(tmp_path, vrt):
    """With survivors kept (the controller's default): srv2 dies; the two survivors' workers are told to regroup
    (none restarted), the job's warm spare (started once the job ran: the free M40, gpu4) is told the lost rank, and
    the job ends done from the checkpoint; a new warm spare is started for the next loss (none of its model is free
    then: none)."""
    from tests.unit.jobfakes import service

    driver = FakeDriver(pace=PACE)
    placement, _, _ = service(tmp_path, RACK, driver, vrt, keep_survivors=True)
    vrt.advance(0)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3"])
    vrt.run(lambda: len(job.iterations()) >= 12, what="12 iterations")
    (warm,) = [g for j, g, c in driver.started if j == job.id and "--warm" in c]
    assert warm == "gpu4"  # of the job's model: the TitanVs are free too, but are not kept warm for M40s
    driver.kill_server("srv2")
    vrt.run(finished(placement, job.id), what="the job to end")
    assert job.state == "done", job.reason
    (rec,) = job.recoveries
    assert rec["spares"] == {"gpu2": warm} and rec["warm"] == {warm: True} and rec["resumed_from"] == 10, rec
    assert sorted(rec["kept"]) == ["gpu1", "gpu3"], rec
    started = [g for j, g, c in driver.started if j == job.id and "--warm" not in c]
    assert sorted(started) == ["gpu1", "gpu2", "gpu3"]  # each once, at the job's start: none restarted
    told = {g: argv for j, g, argv in driver.regrouped if j == job.id}
    assert sorted(told) == sorted(["gpu1", "gpu3", warm])
    assert all(a[a.index("--attempt") + 1] == "1" and a[a.index("--resume-from") + 1] == "10" for a in told.values())
    assert told[warm][told[warm].index("--rank") + 1] == "2"  # the lost rank's place: the last
    assert [i["iteration"] for i in job.iterations()] == list(range(30))
    assert len([g for j, g, c in driver.started if j == job.id and "--warm" in c]) == 1  # no M40 left to keep warm
    assert placement.busy_gpus() == {} and not placement.book.warm


def _srv2_lost_under_a_cold_job(tmp_path, vrt):
    """A job on gpu1-gpu4 with no warm spare, survivors kept; srv2 (gpu2) killed after 12 iterations."""
    from tests.unit.jobfakes import service

    driver = FakeDriver(pace=PACE)
    placement, _, _ = service(tmp_path, RACK, driver, vrt, keep_survivors=True)
    vrt.advance(0)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"], warm_spares=0)
    vrt.run(lambda: len(job.iterations()) >= 12, what="12 iterations")
    driver.kill_server("srv2")
    return driver, placement, job


def test_a_swap_with_no_warm_spare_starts_a_container_and_says_so(tmp_path, vrt):
    driver, placement, job = _srv2_lost_under_a_cold_job(tmp_path, vrt)
    vrt.run(finished(placement, job.id), what="the job to end")
    assert job.state == "done", job.reason
    (rec,) = job.recoveries
    spare = rec["spares"]["gpu2"]
    assert rec["warm"] == {spare: False} and sorted(rec["kept"]) == ["gpu1", "gpu3", "gpu4"], rec
    assert f"gpu2 -> {spare} (no warm spare: a container started)" in job.note, job.note
    assert [g for j, g, c in driver.started if j == job.id][4:] == [spare]  # only the spare's container


def test_the_record_says_the_checkpoint_the_ranks_were_told_though_they_saved_a_newer_one_before_it(tmp_path, vrt,
                                                                                                      monkeypatch):
    """The spare's container is slow to come up (8 s more, as on a loaded host) while the survivors, told to go on
    from iteration 10, already train and save iteration 15 in the new attempt: the recovery's record says 10, the
    checkpoint every rank restored (not the newest one held when the record is written), and counts the iterations
    redone from it."""
    from controller.jobs.workers import Workers

    start = Workers.start

    def slow_start(self, job, gpus, restores=None, *more, **kw):
        image = start(self, job, gpus, restores, *more, **kw)
        if restores:  # a recovery's containers: up, and slow to say so
            vrt.sleep(8.0)
        return image

    monkeypatch.setattr(Workers, "start", slow_start)
    driver, placement, job = _srv2_lost_under_a_cold_job(tmp_path, vrt)
    vrt.run(lambda: job.recoveries or not job.active, what="the recovery's record")
    (rec,) = job.recoveries
    newer = [r["iteration"] for g in rec["kept"] for r in job.reports[g]
             if r.get("event") == "checkpoint" and r.get("attempt") == rec["attempt"]]
    assert newer and max(newer) > 10, newer  # the race: a newer checkpoint held before the record
    told = {g: argv for j, g, argv in driver.regrouped if j == job.id}
    assert all(a[a.index("--resume-from") + 1] == "10" for a in told.values()), told
    assert rec["resumed_from"] == 10 and rec["iterations_redone"] == rec["reached"] - 10, rec
    vrt.run(finished(placement, job.id), what="the job to end")
    assert job.state == "done", job.reason


def test_a_job_keeps_warm_spares_per_gpu_model_and_switch_it_spans(tmp_path, vrt):
    """warm_spares counts per (GPU model, switch) of the job's GPUs: a job of an M40 and a TitanV under one switch
    keeps one warm spare of each model; with warm_spares 2, two of each where the rack has them."""
    from tests.unit.jobfakes import service

    driver = FakeDriver(pace=PACE)
    placement, _, _ = service(tmp_path, RACK, driver, vrt, keep_survivors=True)
    vrt.advance(0)
    job = job_of(placement, ["gpu1", "gpu5"], iterations=200)
    vrt.run(lambda: len(job.iterations()) >= 2 and len(placement.book.warm) >= 2, what="two warm spares")
    warm = sorted(g for g, j in placement.book.warm.items() if j == job.id)
    assert sorted(RACK.gpus[g].model for g in warm) == ["M40", "TitanV"], warm
    placement.stop(job.id)
    vrt.run(finished(placement, job.id), what="the job to stop")
    assert not placement.book.warm
    job = job_of(placement, ["gpu1", "gpu2"], iterations=200, warm_spares=2)  # two M40s under one switch
    vrt.run(lambda: len(job.iterations()) >= 2 and len(placement.book.warm) >= 2, what="two warm spares")
    vrt.advance(5)
    warm = sorted(g for g, j in placement.book.warm.items() if j == job.id)
    assert len(warm) == 2 and all(RACK.gpus[g].model == "M40" for g in warm), warm


def test_a_job_keeps_no_warm_spare_of_another_model(tmp_path, vrt):
    """The two TitanVs in one job: no TitanV is left free, and the free M40s are not kept warm for it (jobs that ask
    for M40s would wait for their eviction); a loss would take an M40 cold, by the spare rule."""
    from tests.unit.jobfakes import service

    driver = FakeDriver(pace=PACE)
    placement, _, _ = service(tmp_path, RACK, driver, vrt, keep_survivors=True)
    vrt.advance(0)
    job = job_of(placement, ["gpu5", "gpu6"], iterations=200)
    vrt.run(lambda: len(job.iterations()) >= 2, what="two iterations")
    vrt.advance(5)
    assert placement.book.warm == {} and not [c for j, g, c in driver.started if "--warm" in c]


def test_a_job_stopped_while_its_containers_start_leaves_none(tmp_path, vrt):
    """Stopped while a recovery's containers are starting (an action in flight): the stop waits for that action,
    then removes what it started; nothing of the job is left on a live engine."""
    from tests.unit.jobfakes import service

    class SlowStart(FakeDriver):
        def start(self, spec, image=None, reuse=False):
            self.sleep(3.0)
            return super().start(spec, image, reuse)

    driver = SlowStart(pace=PACE)
    placement, _, _ = service(tmp_path, RACK, driver, vrt)
    vrt.advance(0)
    job = job_of(placement, ["gpu1", "gpu2", "gpu3", "gpu4"], warm_spares=0)
    vrt.run(lambda: len(job.iterations()) >= 6, what="6 iterations")
    driver.kill_server("srv2")
    vrt.run(lambda: placement.book.inflight.get(job.id, ("",))[0] == "recovery.restarted", what="the restart")
    stopped = placement.stop(job.id)  # answered once the job has ended, after the start it waited for
    assert stopped.state == "stopped" and placement.busy_gpus() == {}
    vrt.advance(10)  # whatever was still starting has started by now
    left = [c for c in driver.running.values() if c.labels["job"] == job.id and c.labels["server"] != "srv2"]
    assert left == [], [c.name for c in left]


@pytest.mark.parametrize("step", ["assessed", "swapped", "told"])
def test_after_a_restart_mid_recovery_the_survivors_keep_their_processes_and_nothing_is_recorded_twice(
        tmp_path, vrt, step):
    """The controller killed at a step of a recovery: the new one finds the survivors' workers still running, follows
    them again (their output from its start, nothing of it recorded twice) and tells them the new ring: they keep their
    processes; only the lost rank's spare starts a container."""
    from tests.unit.jobfakes import service
    from tests.unit.virtual import VirtualRuntime

    driver = FakeDriver(pace=PACE)
    old, _, _ = service(tmp_path, RACK, driver, vrt, keep_survivors=True)
    vrt.advance(0)
    old.recovery.hold_at = step
    job = job_of(old, ["gpu1", "gpu2", "gpu3"], warm_spares=0)
    vrt.run(lambda: len(job.iterations()) >= 12, what="12 iterations")
    driver.kill_server("srv2")
    vrt.run(lambda: job.recovery is not None and job.recovery["step"] == step, what=f"the recovery held at {step}")
    rt = VirtualRuntime()
    jobs, _, _ = service(tmp_path, RACK, driver, rt, keep_survivors=True)
    again = jobs.get(job.id)
    rt.run(finished(jobs, job.id), what="the job to end after the restart")
    assert again.state == "done", again.reason
    (rec,) = again.recoveries
    assert rec["resumed"] and sorted(rec["kept"]) == ["gpu1", "gpu3"], rec
    starts = [g for j, g, c in driver.started if j == job.id]
    assert sorted(starts) == sorted(["gpu1", "gpu2", "gpu3", rec["spares"]["gpu2"]]), starts  # survivors once each
    lines = [(g, r["attempt"], r["iteration"]) for g, rs in again.reports.items() for r in rs
             if r.get("event") == "iteration"]
    assert len(lines) == len(set(lines)), "a line recorded twice"
    assert [i["iteration"] for i in again.iterations()] == list(range(30))
    rt.close()

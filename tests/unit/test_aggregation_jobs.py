"""Jobs that ask for in-network aggregation (controller/jobs/aggregation.py), on the job service built alone (fake
workers and circuit changes, virtual time): placed under a switch whose aggregator has room, that room reserved
while the job is active and given back at every ending, kept or moved by a fail-over's new attempt (one attempt's
room at a time, the old attempt's pool freed), counted again after a restart, mid-recovery too; a ring, saying why,
where no aggregator has room. And the placement's confinement to given switches."""
from __future__ import annotations

import copy

import pytest
import yaml

from controller.core import placement as policy
from controller.core.circuits import CircuitMap
from controller.core.jobs import JobRequest
from controller.core.occupancy import Occupancy
from controller.core.rack import parse_rack
from controller.jobs import aggregation
from tests.unit.jobfakes import FakeDriver, service
from tests.unit.test_rack import PAPER
from tests.unit.virtual import VirtualRuntime

PAPER_DATA = yaml.safe_load(PAPER.read_text())
ADDRESS = {"as1": "198.18.0.250:9999", "as2": "198.18.0.251:9999"}


def rack_with(**aggregators):
    """The paper rack with each named switch's aggregator changed (a dict of fields) or taken away (None)."""
    data = copy.deepcopy(PAPER_DATA)
    for w in data["switches"]:
        if w["name"] in aggregators:
            if aggregators[w["name"]] is None:
                del w["aggregator"]
            else:
                w["aggregator"].update(aggregators[w["name"]])
    return parse_rack(data, "test rack")


def make(tmp_path, rack, driver, rt):
    jobs, state, _ = service(tmp_path, rack, driver, rt)
    rt.advance(0)
    return state, jobs


def req(**kw) -> JobRequest:
    kw.setdefault("workload", {"iterations": 3})
    kw.setdefault("collective", "aggregate")
    return JobRequest.model_validate(kw)


def flags(command: list[str]) -> dict[str, str]:
    return {f: command[command.index(f) + 1] for f in ("--collective", "--aggregator", "--aggregation-job",
                                                       "--aggregation-slots", "--aggregation-chunk") if f in command}


def commands(driver, job, attempt=None):
    return [cmd for j, _, cmd in driver.started if j == job.id and "--warm" not in cmd
            and (attempt is None or cmd[cmd.index("--attempt") + 1] == str(attempt))]


@pytest.mark.parametrize("ending", ["done", "stopped", "failed"])
def test_an_aggregating_job_holds_its_aggregators_room_until_it_ends(tmp_path, vrt, ending):
    driver = FakeDriver(block=ending == "stopped", exit_codes={"gpu3": 3} if ending == "failed" else None)
    rack = rack_with()
    state, jobs = make(tmp_path, rack, driver, vrt)
    job = jobs.submit(req(gpus=["gpu1", "gpu2", "gpu3", "gpu4"]))  # fragmented: as1 and as2 at the start
    a = job.aggregation
    slots, chunk = aggregation.pool_shape(rack)
    assert a["collective"] == "aggregate" and a["address"] == ADDRESS[a["switch"]]
    assert (a["slots"], a["chunk"], a["bytes"]) == (slots, chunk, slots * chunk * 4)
    assert aggregation.held(jobs.book) == {a["switch"]: (1, a["bytes"])}  # reserved at admission
    vrt.run(lambda: job.state != "pending" and job.state != "configuring", what="the job placed")
    assert job.switches == [a["switch"]]  # regrouped under its aggregator's switch
    assert {state.circuits.gpu_locations(rack)[g][0] for g in job.gpus} == {a["switch"]}
    cmds = commands(driver, job)
    assert len(cmds) == 4 and all(flags(c) == {
        "--collective": "aggregate", "--aggregator": a["address"], "--aggregation-job": str(a["key"]),
        "--aggregation-slots": str(slots), "--aggregation-chunk": str(chunk)} for c in cmds)
    if ending == "stopped":
        vrt.run(lambda: job.state == "running")
        assert aggregation.held(jobs.book) == {a["switch"]: (1, a["bytes"])}
        assert jobs.runs.aggregators.ended == []  # the aggregator is told nothing while the job runs
        jobs.stop(job.id)
    vrt.run(lambda: not job.active, what="the job to end")
    assert job.state == ending, job.reason
    assert aggregation.held(jobs.book) == {}  # given back
    ended = jobs.runs.aggregators.ended
    if ending == "failed":  # it failed after its recoveries: each fail-over freed its old attempt's pool, and the end
        assert len(job.recoveries) == 5 and len(ended) == 6 and {k for _, k in ended} == {a["key"]}
        assert job.aggregation["key"] == a["key"] and ended[-1] == (job.aggregation["switch"], a["key"])
        return
    assert job.aggregation == a  # the record still says where it ran
    assert ended == [(a["switch"], a["key"])]  # and the aggregator told: its slots freed now


def test_a_full_aggregator_sends_the_next_job_elsewhere_then_a_ring_with_the_reason(tmp_path, vrt):
    rack = rack_with(as1={"jobs": 1}, as2={"capacity_bytes": 1000})
    driver = FakeDriver(block=True)
    state, jobs = make(tmp_path, rack, driver, vrt)
    first = jobs.submit(req(gpus=2))
    assert first.aggregation["switch"] == "as1"  # as2's aggregator is too small for a pool
    ring = jobs.submit(req(gpus=2))
    vrt.run(lambda: first.state == ring.state == "running", what="both jobs running")
    assert ring.aggregation["collective"] == "ring"
    assert ring.aggregation["reason"] == ("no aggregator has room: as1's holds 1 job(s), its most; as2's has 1000 of "
                                          f"1000 bytes free, {first.aggregation['bytes']} needed")
    assert all(flags(c) == {} for c in commands(driver, ring))  # its workers run as a ring
    plain = jobs.submit(req(gpus=1, collective="ring"))
    assert plain.aggregation is None
    jobs.stop(first.id)
    vrt.run(lambda: not first.active)
    again = jobs.submit(req(gpus=1))  # the room given back at the stop
    assert again.aggregation["collective"] == "aggregate" and again.aggregation["switch"] == "as1"
    assert aggregation.held(jobs.book) == {"as1": (1, again.aggregation["bytes"])}
    vrt.run(lambda: plain.state == again.state == "running")
    for j in (ring, plain, again):
        jobs.stop(j.id)


def test_without_a_switch_that_takes_its_gpus_it_runs_as_a_ring(tmp_path, vrt):
    """The fixed policy keeps gpu1 under as1 and gpu3 under as2: no one switch with an aggregator takes both."""
    driver = FakeDriver(block=True)
    state, jobs = make(tmp_path, rack_with(), driver, vrt)
    job = jobs.submit(req(gpus=["gpu1", "gpu3"], policy="fixed"))
    assert job.aggregation == {"collective": "ring", "reason": "no switch whose aggregator has room can take "
                               "its GPUs now: the fixed policy keeps them under 2 switch(es), not all under one of "
                               "as1, as2"}
    assert job.switches == ["as1", "as2"] and aggregation.held(jobs.book) == {}
    vrt.run(lambda: job.state == "running")
    assert all(flags(c) == {} for c in commands(driver, job))
    jobs.stop(job.id)


def test_a_fail_over_keeps_the_aggregator_and_a_restart_counts_it_again(tmp_path, vrt):
    rack = rack_with(as1={"jobs": 1}, as2={"jobs": 1})
    driver = FakeDriver(pace=1.0)
    state, jobs = make(tmp_path, rack, driver, vrt)
    job = jobs.submit(req(gpus=["gpu1", "gpu2", "gpu3"], workload={"iterations": 1000}, checkpoint_every=5))
    a = dict(job.aggregation)
    vrt.run(lambda: len(job.iterations()) >= 7, what="a checkpoint")
    driver.kill_server("srv2")
    vrt.run(lambda: job.state == "recovering", what="the loss to be seen")
    assert aggregation.held(jobs.book) == {a["switch"]: (1, a["bytes"])}  # held while it recovers
    vrt.run(lambda: job.state == "running" and job.recoveries, what="the spare swapped in")
    assert job.attempt == 1 and job.aggregation == a
    new = commands(driver, job, attempt=1)
    assert new and all(flags(c)["--aggregator"] == a["address"] and flags(c)["--aggregation-job"] == str(a["key"])
                       for c in new)
    other = jobs.submit(req(gpus=1, workload={"iterations": 1000}))
    assert other.aggregation["switch"] != a["switch"]  # the other aggregator: the first is still held
    vrt.run(lambda: other.state == "running")
    rt2 = VirtualRuntime()  # a restart: the reservations come back from the jobs' records
    state2, jobs2 = make(tmp_path, rack, driver, rt2)
    assert aggregation.held(jobs2.book) == {a["switch"]: (1, a["bytes"]), other.aggregation["switch"]:
                                            (1, other.aggregation["bytes"])}
    third = jobs2.submit(req(gpus=1))
    assert third.aggregation["collective"] == "ring" and "its most" in third.aggregation["reason"]
    rt2.run(lambda: all(jobs2.get(j).state == "running" for j in (job.id, other.id, third.id)), what="all running")
    for j in (job.id, other.id, third.id):
        jobs2.stop(j)
    assert aggregation.held(jobs2.book) == {}


def test_a_confined_plan_puts_every_gpu_under_one_of_the_given_switches():
    rack = rack_with()
    occ = Occupancy(rack, CircuitMap.initial(rack), {})
    p = policy.plan(occ, policy.Request(4, switches=("as2",)))
    assert p.switches == ("as2",) and len(p.gpus) == 4
    named = policy.plan(occ, policy.Request(("gpu1", "gpu2", "gpu3"), switches=("as2",)))
    assert named.switches == ("as2",)
    data = copy.deepcopy(PAPER_DATA)  # as2 with three downlinks, one of them held by a job's GPU (gpu3)
    data["switches"][1]["downlinks"] = data["switches"][1]["downlinks"][:3]
    small = parse_rack(data, "test rack")
    held = Occupancy(small, CircuitMap.initial(small), {"gpu3": "job-x"})
    assert len(policy.plan(held, policy.Request(4)).gpus) == 4  # free to spread: it fits
    with pytest.raises(policy.NoRoomNow, match="no switch of as2 can take all 4 GPUs under it now"):
        policy.plan(held, policy.Request(4, switches=("as2",)))
    with pytest.raises(policy.NoRoomNow, match="not all under one of as1"):
        policy.plan(occ, policy.Request(("gpu1", "gpu3"), "fixed", switches=("as1",)))
    assert policy.plan(occ, policy.Request(("gpu1", "gpu2"), "fixed", switches=("as1",))).switches == ("as1",)


def test_a_bad_collective_is_refused_naming_the_field():
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="collective"):
        JobRequest.model_validate({"gpus": 2, "collective": "tree"})
    assert JobRequest.model_validate({"gpus": 2}).collective == "ring"


def test_the_cli_asks_for_aggregation_and_shows_where_each_job_sums(monkeypatch, capsys):
    from controller import cli, cli_jobs

    base = {"id": "job-1", "state": "running", "gpus": ["gpu1"], "switches": ["as1"], "iterations_done": 1,
            "iterations_total": 3, "mean_iteration_s": None, "completion_s": None, "reason": None, "note": "",
            "position": None, "request": {"gpus": 1, "collective": "aggregate"}}
    sent = []

    class Client:
        def post(self, path, body):
            sent.append(body)
            return {"job": {**base, "aggregation": {"collective": "aggregate", "switch": "as1",
                                                    "address": "198.18.0.250:9999"}}}

    monkeypatch.setattr(cli_jobs, "_client", lambda args: Client())
    assert cli.main(["submit", "--gpus", "1", "--collective", "aggregate"]) == 0
    assert sent[0]["collective"] == "aggregate"
    assert "[aggregate at as1's aggregator 198.18.0.250:9999]" in capsys.readouterr().out
    ring = {**base, "aggregation": {"collective": "ring", "reason": "no aggregator has room: as1's holds 1 job(s)"}}
    assert cli_jobs._job_line(ring).endswith("[ring: no aggregator has room: as1's holds 1 job(s)]")
    assert "aggregate" not in cli_jobs._job_line({**base, "request": {"gpus": 1}, "aggregation": None})
    with pytest.raises(SystemExit):
        cli.main(["submit", "--gpus", "1", "--collective", "tree"])


class RefusedDriver(FakeDriver):
    """Workers whose start line says the aggregator refused their job: they run as a ring."""

    def start(self, spec, image=None, reuse=False):
        import json

        name = super().start(spec, image, reuse)
        self.running[name].lines.insert(0, json.dumps({"event": "start", "attempt": 0, "collective": "ring",
                                                       "aggregation_refused": "the aggregator holds 4 jobs, its most"}))
        return name


def test_workers_the_aggregator_refused_make_the_record_say_ring_and_give_the_room_back(tmp_path, vrt):
    state, jobs = make(tmp_path, rack_with(), RefusedDriver(block=True), vrt)
    job = jobs.submit(req(gpus=2))
    switch, address = job.aggregation["switch"], job.aggregation["address"]
    vrt.run(lambda: job.aggregation["collective"] == "ring", what="the workers' start lines")
    assert job.state == "running" and job.aggregation == {"collective": "ring", "reason": f"{switch}'s aggregator "
                                                          f"{address} did not take it (the aggregator holds 4 jobs, "
                                                          "its most): its workers run as a ring"}
    assert aggregation.held(jobs.book) == {}
    jobs.stop(job.id)


def _watch(jobs, seen: list):
    """A predicate's side: the room held at every step the runtime takes (never two attempts holding room)."""
    seen.append(aggregation.held(jobs.book))
    return True


def test_a_fail_over_regroups_under_an_aggregator_with_room_and_frees_the_old_attempts_pool(tmp_path, vrt):
    """gpu1 and gpu2 aggregate under as1, where both hang; srv1 and srv2 go down (the aggregator's switch loses its
    servers): the spares gpu3 and gpu4 hang under as2, whose aggregator has room, so the new attempt is regrouped
    there and sums at as2's aggregator (same key); as1's room is given back in the same step, and as1's aggregator
    is told the old attempt is over, before the new attempt's workers start. The event and the job's note say so."""
    rack = rack_with(as1={"jobs": 1}, as2={"jobs": 1})
    driver = FakeDriver(pace=1.0)
    state, jobs = make(tmp_path, rack, driver, vrt)
    job = jobs.submit(req(gpus=["gpu1", "gpu2"], workload={"iterations": 1000}, checkpoint_every=5))
    a = dict(job.aggregation)
    assert a["switch"] == "as1"
    vrt.run(lambda: len(job.iterations()) >= 7, what="a checkpoint")
    driver.kill_server("srv1")
    driver.kill_server("srv2")
    seen: list = []
    vrt.run(lambda: _watch(jobs, seen) and job.state == "running" and job.recoveries, what="the new attempt")
    assert all(sum(n for n, _ in h.values()) == 1 for h in seen), seen  # one attempt's room at every step
    assert job.attempt == 1 and sorted(job.gpus) == ["gpu3", "gpu4"] and job.switches == ["as2"]
    assert job.aggregation == {**a, "switch": "as2", "address": ADDRESS["as2"]}  # the same key, as2's aggregator
    assert aggregation.held(jobs.book) == {"as2": (1, a["bytes"])}
    assert jobs.recovery.aggregators.ended == [("as1", a["key"])]  # the old attempt's pool freed at as1
    new = commands(driver, job, attempt=1)
    assert len(new) == 2 and all(flags(c)["--aggregator"] == ADDRESS["as2"] for c in new)
    (rec,) = job.recoveries
    said = "the new attempt aggregates at as2's aggregator 198.18.0.251:9999 (moved from as1's)"
    assert rec["aggregation"] == said and said in job.note and state.events.get(rec["event"]).note == said
    other = jobs.submit(req(gpus=["gpu6"], gpu_model="TitanV"))  # as1's room is free again
    assert other.aggregation["switch"] == "as1"
    jobs.stop(job.id)
    vrt.run(lambda: not job.active)
    assert jobs.runs.aggregators.ended[-1] == ("as2", a["key"])  # its end told where it summed last
    jobs.stop(other.id)


def _three_downlinks_on_as1(**aggregators):
    """The paper rack with 3 downlinks on as1 (gpu1, gpu2 and gpu6 cabled there) and the aggregators as rack_with."""
    data = copy.deepcopy(PAPER_DATA)
    for w in data["switches"]:
        if w["name"] in aggregators and aggregators[w["name"]] is None:
            del w["aggregator"]
        if w["name"] == "as1":
            w["downlinks"] = w["downlinks"][:3]
    data["circuits"] = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:6", "ocs1:13"], ["ocs1:5", "ocs1:21"],
                        ["ocs1:3", "ocs1:22"], ["ocs1:4", "ocs1:23"]]
    return parse_rack(data, "test rack")


def test_a_fail_over_no_aggregator_can_take_runs_the_new_attempt_as_a_ring_and_says_why(tmp_path, vrt):
    """as1 (the only aggregator) has 3 downlinks: gpu1 and gpu2 of the aggregating job, gpu6 of a ring job. srv1
    goes down: the spare (under as2) cannot join gpu2 under as1 while gpu6 runs there and gpu1's server is down,
    so the new attempt is regrouped as any job, runs as a ring, and its record, event and note say why; as1's room
    is given back and its aggregator told."""
    rack = _three_downlinks_on_as1(as2=None)
    driver = FakeDriver(pace=1.0)
    state, jobs = make(tmp_path, rack, driver, vrt)
    pinned = jobs.submit(req(gpus=["gpu6"], collective="ring", policy="fixed", workload={"iterations": 1000}))
    job = jobs.submit(req(gpus=["gpu1", "gpu2"], workload={"iterations": 1000}, checkpoint_every=5))
    a = dict(job.aggregation)
    assert a["switch"] == "as1"
    vrt.run(lambda: len(job.iterations()) >= 7 and pinned.state == "running", what="a checkpoint")
    driver.kill_server("srv1")
    vrt.run(lambda: job.state == "running" and job.recoveries, what="the new attempt")
    assert job.aggregation["collective"] == "ring" and job.aggregation["reason"].startswith(
        "no switch whose aggregator has room can take its GPUs now")
    assert aggregation.held(jobs.book) == {} and jobs.recovery.aggregators.ended == [("as1", a["key"])]
    assert all(flags(c) == {} for c in commands(driver, job, attempt=1))
    (rec,) = job.recoveries
    assert rec["aggregation"] == f"the new attempt runs as a ring: {job.aggregation['reason']}"
    assert rec["aggregation"] in job.note
    for j in (job, pinned):
        jobs.stop(j.id)


@pytest.mark.parametrize("step", ["assessed", "swapped"])
def test_a_restart_mid_recovery_counts_one_attempts_room(tmp_path, vrt, step):
    """The controller dies while the job recovers, before the new attempt is placed (assessed: the old attempt's
    room at as1 still held) or after (swapped: as2's); the new controller counts that one room, carries the recovery
    on, and the job ends up at as2's aggregator with as1's pool freed and as1's room free."""
    rack = rack_with(as1={"jobs": 1}, as2={"jobs": 1})
    driver = FakeDriver(pace=1.0)
    state, jobs = make(tmp_path, rack, driver, vrt)
    jobs.recovery.hold_at = step
    job = jobs.submit(req(gpus=["gpu1", "gpu2"], workload={"iterations": 1000}, checkpoint_every=5))
    a = dict(job.aggregation)
    vrt.run(lambda: len(job.iterations()) >= 7, what="a checkpoint")
    driver.kill_server("srv1")
    driver.kill_server("srv2")
    vrt.run(lambda: job.state == "recovering" and job.recovery["step"] == step, what=f"the recovery held at {step}")
    vrt.advance(2)
    before = "as1" if step == "assessed" else "as2"
    assert aggregation.held(jobs.book) == {before: (1, a["bytes"])}
    rt2 = VirtualRuntime()  # a restart on the same state and engines
    state2, jobs2 = make(tmp_path, rack, driver, rt2)
    again = jobs2.get(job.id)
    assert sum(n for n, _ in aggregation.held(jobs2.book).values()) == 1  # one attempt's room, from the record
    seen: list = []
    rt2.run(lambda: _watch(jobs2, seen) and again.state == "running" and again.recoveries, what="the new attempt")
    assert all(sum(n for n, _ in h.values()) == 1 for h in seen), seen
    assert again.aggregation["switch"] == "as2" and aggregation.held(jobs2.book) == {"as2": (1, a["bytes"])}
    assert all(flags(c)["--aggregator"] == ADDRESS["as2"] for c in commands(driver, again, attempt=1))
    ended = jobs.recovery.aggregators.ended + jobs2.recovery.aggregators.ended
    assert ("as1", a["key"]) in ended and ("as2", a["key"]) not in ended
    jobs2.stop(again.id)


def _failing_over_slowly(jobs, driver, vrt):
    """gpu1 and gpu2 aggregating under as1 lose their servers; returns (the job, its first aggregation) once the
    fail-over's circuit change is made and its action still waits (the OCS's switching, 0.5 s) before it returns."""
    changes, planned = jobs.recovery.changes, []
    real = changes.change

    def slow(plan, kind, *args, **kw):
        ev = real(plan, kind, *args, **kw)
        if kind == "failover":
            planned.append(ev)
            vrt.sleep(0.5)
        return ev

    changes.change = slow
    job = jobs.submit(req(gpus=["gpu1", "gpu2"], workload={"iterations": 1000}, checkpoint_every=5))
    a = dict(job.aggregation)
    vrt.run(lambda: len(job.iterations()) >= 7, what="a checkpoint")
    driver.kill_server("srv1")
    driver.kill_server("srv2")
    vrt.run(lambda: bool(planned), what="the new attempt's circuit change")
    return job, a


def test_a_restart_while_a_fail_over_places_its_new_attempt_gives_the_chosen_room_up_and_chooses_again(tmp_path, vrt):
    """The controller dies while the fail-over's circuit change is under way: the new controller finds the room
    chosen for the new attempt (as2's) in the record, gives it up when it carries the recovery on, and chooses again:
    never more than one room held, the job at as2's aggregator in the end."""
    rack = rack_with(as1={"jobs": 1}, as2={"jobs": 1})
    driver = FakeDriver(pace=1.0)
    state, jobs = make(tmp_path, rack, driver, vrt)
    job, a = _failing_over_slowly(jobs, driver, vrt)
    rt2 = VirtualRuntime()
    jobs2, state2, _ = service(tmp_path, rack, driver, rt2, start=False)
    again = jobs2.book.jobs[job.id]
    assert aggregation.held(jobs2.book) == {"as2": (1, a["bytes"])}  # the chosen room, from the record
    jobs2.start()
    seen: list = []
    rt2.run(lambda: _watch(jobs2, seen) and again.state == "running" and again.recoveries, what="the new attempt")
    assert {} in seen  # given up when the recovery is carried on, then chosen again
    assert all(sum(n for n, _ in h.values()) <= 1 for h in seen), seen
    assert again.aggregation["switch"] == "as2" and aggregation.held(jobs2.book) == {"as2": (1, a["bytes"])}
    jobs2.stop(again.id)


def test_an_admission_while_a_fail_over_places_its_new_attempt_cannot_take_the_room_chosen_for_it(tmp_path, vrt):
    """The circuit change of a fail-over takes time after its plan (the OCS switching): a job admitted then sees the
    new attempt's room at as2 held (chosen and reserved on the loop with the spares), as1's given up, and takes as1;
    no aggregator ever holds more jobs than its most. A swap that fails gives the chosen room up."""
    rack = rack_with(as1={"jobs": 1}, as2={"jobs": 1})
    driver = FakeDriver(pace=1.0)
    state, jobs = make(tmp_path, rack, driver, vrt)
    job, a = _failing_over_slowly(jobs, driver, vrt)
    assert job.state == "recovering" and job.aggregation["switch"] == "as1"  # not yet recorded as the job's
    other = jobs.submit(req(gpus=["gpu6"], gpu_model="TitanV", workload={"iterations": 1000}))
    seen: list = []
    vrt.run(lambda: _watch(jobs, seen) and job.state == "running" and job.recoveries, what="the new attempt")
    assert job.aggregation["switch"] == "as2" and other.aggregation["switch"] == "as1"
    assert all(n <= 1 for h in seen for n, _ in h.values()), seen  # never two jobs at an aggregator of one
    assert aggregation.held(jobs.book) == {"as1": (1, a["bytes"]), "as2": (1, a["bytes"])}
    for j in (job, other):
        jobs.stop(j.id)



def test_a_swap_that_fails_gives_the_room_chosen_for_it_up(tmp_path, vrt):
    """The fail-over's first circuit change fails (the OCS refused it): the room chosen for the new attempt at as2 is
    given up with it (the job holds none, as1's given up when as2's was chosen), and the next try chooses again."""
    rack = rack_with(as1={"jobs": 1}, as2={"jobs": 1})
    driver = FakeDriver(pace=1.0)
    state, jobs = make(tmp_path, rack, driver, vrt)
    changes, failed = jobs.recovery.changes, []
    real = changes.change

    def refused_once(plan, kind, *args, **kw):
        if kind == "failover" and not failed:
            plan(state.circuits)
            failed.append(aggregation.held(jobs.book))  # as2's, chosen before the change
            raise OSError("the OCS refused the change")
        return real(plan, kind, *args, **kw)

    changes.change = refused_once
    job = jobs.submit(req(gpus=["gpu1", "gpu2"], workload={"iterations": 1000}, checkpoint_every=5))
    a = dict(job.aggregation)
    vrt.run(lambda: len(job.iterations()) >= 7, what="a checkpoint")
    driver.kill_server("srv1")
    driver.kill_server("srv2")
    seen: list = []
    vrt.run(lambda: _watch(jobs, seen) and job.state == "running" and job.recoveries, what="the new attempt")
    assert failed == [{"as2": (1, a["bytes"])}]
    assert {} in seen[seen.index({"as2": (1, a["bytes"])}):]  # given up after the failure, before the next try
    assert job.aggregation["switch"] == "as2" and aggregation.held(jobs.book) == {"as2": (1, a["bytes"])}
    jobs.stop(job.id)

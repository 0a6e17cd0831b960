"""Jobs that ask for in-network aggregation (controller/jobs/aggregation.py), on the job service built alone (fake
workers and circuit changes, virtual time): placed under a switch whose aggregator has room, that room reserved
while the job is active and given back at every ending, kept by a fail-over's new attempt, counted again after a
restart; a ring, saying why, where no aggregator has room. And the placement's confinement to given switches."""
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
    assert job.aggregation == a  # the record still says where it ran
    assert jobs.runs.aggregators.ended == [(a["switch"], a["key"])]  # and the aggregator told: its slots freed now


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

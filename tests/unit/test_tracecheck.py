"""The trace check's comparison (evidence/tracecheck.py) and the replay's pure parts (scripts/replay_trace.py),
on synthetic rows and records."""
from __future__ import annotations

from pathlib import Path

import pytest

from evidence import tracecheck as tc
from scripts import replay_trace as rt


def _rows(ends: list[float], starts: list[float] | None = None) -> list[dict]:
    starts = starts or [0.0] * len(ends)
    return [{"index": i, "arrival_s": 0.0, "start_s": s, "end_s": e} for i, (s, e) in enumerate(zip(starts, ends,
                                                                                                   strict=True))]


def test_a_simulation_within_the_bounds_passes():
    emulated = _rows([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    simulated = _rows([10.5, 19, 31, 40, 52, 60, 70, 79, 91, 101], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    c = tc.compare(emulated, simulated, 12, 10)
    assert c["jct_error_median"] == pytest.approx(0.0125, abs=1e-3)
    assert c["makespan_error"] == pytest.approx(0.01)
    assert c["start_order_same"] and c["circuit_changes_emulated"] == 12
    assert tc.checks(c) == []


def test_each_bound_can_fail():
    emulated = _rows([10.0] * 10, list(range(10)))
    slow = _rows([12.0] * 9 + [20.0], list(range(10)))  # every job 20 % slow, one 100 %
    bad = tc.checks(tc.compare(emulated, slow, 0, 0))
    assert any(b.startswith("median |error|") for b in bad) and any(b.startswith("p90") for b in bad)
    assert any(b.startswith("makespan +100.0 %") for b in bad)
    tail = _rows([10.0] * 8 + [13.0, 13.0], list(range(10)))  # two jobs of ten 30 % off: only the p90 fails
    bad = tc.checks(tc.compare(emulated, tail, 0, 0))
    assert [b.split()[0] for b in bad] == ["p90", "makespan"]
    swapped = _rows([10.0] * 10, [1, 0, 2, 3, 4, 5, 6, 7, 8, 9])
    c = tc.compare(emulated, swapped, 0, 0)
    assert not c["start_order_same"] and c["start_order_discordant"] == [(0, 1)]
    assert tc.checks(c) == ["start order differs: 1 pairs of jobs the other way round"]


def test_ties_in_start_are_ordered_by_the_trace_and_p90_interpolates():
    rows = [{"index": 2, "start_s": 5.0}, {"index": 0, "start_s": 5.0}, {"index": 1, "start_s": 1.0}]
    assert tc.start_order(rows) == [1, 0, 2]
    assert tc.p90([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]) == pytest.approx(9.0)


def test_a_job_that_did_not_end_or_a_missing_job_is_an_error():
    with pytest.raises(ValueError, match="jobs \\[2\\] have no end"):
        tc.compare(_rows([10.0, None]), _rows([10.0, 11.0]), 0, 0)
    with pytest.raises(ValueError, match="different jobs"):
        tc.compare(_rows([10.0]), _rows([10.0, 11.0]), 0, 0)


def test_a_replayed_policy_becomes_comparison_rows_and_a_failed_job_has_no_end():
    run = {"jobs": [{"index": 0, "submit_s": 0.1, "start_s": 0.2, "end_s": 9.0, "state": "done"},
                    {"index": 1, "submit_s": 1.0, "start_s": 2.0, "end_s": 3.0, "state": "failed"}]}
    assert tc.emulated_rows(run) == [{"index": 0, "arrival_s": 0.1, "admit_s": None, "start_s": 0.2, "end_s": 9.0},
                                     {"index": 1, "arrival_s": 1.0, "admit_s": None, "start_s": 2.0, "end_s": None}]
    run["jobs"][0]["admit_s"] = 0.15
    assert tc.emulated_rows(run)[0]["admit_s"] == 0.15


def test_start_order_and_queueing_are_by_admission_where_every_row_has_it():
    # one queue drain admits jobs 1 and 2 (in queue order, 10 ms apart); their containers start the other way round
    emulated = [{"index": 0, "arrival_s": 0.0, "admit_s": 0.0, "start_s": 1.0, "end_s": 10.0},
                {"index": 1, "arrival_s": 1.0, "admit_s": 10.00, "start_s": 12.5, "end_s": 20.0},
                {"index": 2, "arrival_s": 2.0, "admit_s": 10.01, "start_s": 11.5, "end_s": 20.0}]
    # the simulator places both at one instant (a tie: trace order) and starts their containers together
    simulated = [{"index": 0, "arrival_s": 0.0, "admit_s": 0.0, "start_s": 1.0, "end_s": 10.0},
                 {"index": 1, "arrival_s": 1.0, "admit_s": 10.0, "start_s": 11.0, "end_s": 20.0},
                 {"index": 2, "arrival_s": 2.0, "admit_s": 10.0, "start_s": 11.0, "end_s": 20.0}]
    c = tc.compare(emulated, simulated, 0, 0)
    assert c["granted_by"] == "admission" and c["start_order_same"] and c["start_order_emulated"] == [0, 1, 2]
    assert [j["queue_emulated_s"] for j in c["jobs"]] == pytest.approx([0.0, 9.0, 8.01])
    # a record without admissions (made before the controller recorded them): by the containers' start
    old = [{k: v for k, v in r.items() if k != "admit_s"} for r in emulated]
    c = tc.compare(old, simulated, 0, 0)
    assert c["granted_by"] == "containers started" and c["start_order_discordant"] == [(2, 1)]
    assert [j["queue_emulated_s"] for j in c["jobs"]] == pytest.approx([1.0, 11.5, 9.5])
    # the scheduler's order differing is still seen: the simulator admitting job 2 first
    simulated[2]["admit_s"] = 9.0
    assert tc.compare(emulated, simulated, 0, 0)["start_order_discordant"] == [(1, 2)]


def test_the_table_says_what_a_comparison_fails():
    c = tc.compare(_rows([10.0] * 10, list(range(10))), _rows([10.2] * 10, list(range(10))), 4, 6)
    text = tc.table([("20261127T000000Z-abc1234", {"regroup": c})])
    assert "| `20261127T000000Z-abc1234` | regroup | 2.0 % / 2.0 % |" in text and "| 4 / 6 | yes |" in text


def test_the_replay_submits_each_job_when_its_arrival_comes():
    trace = [{"arrival_s": 0.0}, {"arrival_s": 5.0}, {"arrival_s": 5.0}, {"arrival_s": 20.0}]
    assert rt.due(trace, 0, 0.0, 2.0) == [0]
    assert rt.due(trace, 1, 9.9, 2.0) == []
    assert rt.due(trace, 1, 10.0, 2.0) == [1, 2]  # rack seconds x the time dilation
    body = rt.request(3, {"gpus": 4, "model": "vgg16", "iterations": 50}, "defrag")
    assert body == {"name": "trace j4", "gpus": 4, "policy": "regroup", "checkpoint_every": 50, "queue": True,
                    "workload": {"model": "vgg16", "iterations": 50}}
    assert rt.request(3, {"gpus": 4, "model": "vgg16", "iterations": 50}, "fixed", 12.5)["estimate_s"] == 12.5
    assert rt.request(3, {"gpus": 4, "model": "vgg16", "iterations": 50}, "fixed", None, 0)["warm_spares"] == 0
    assert rt.probe_request(0, {"gpus": 1, "model": "resnet50", "iterations": 20}, None, 0)["warm_spares"] == 0
    assert "warm_spares" not in rt.probe_request(0, {"gpus": 1, "model": "resnet50", "iterations": 20})
    assert rt.main(["--warm-spares", "-1"]) == 2  # refused before anything is started


def test_a_replay_under_backfill_sends_the_simulators_estimate_of_each_waiting_job(monkeypatch):
    """The estimates a replay under backfill or sjf sends are the simulator's own for a job that waits: its iterations
    at its iteration time alone (so twice the iterations is twice the estimate), the ones the simulated discipline
    orders the waiting jobs by."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    rack = root / "topologies" / "trace16.yaml"
    trace = [{"arrival_s": 0.0, "gpus": 4, "model": "vgg16", "iterations": 20},
             {"arrival_s": 1.0, "gpus": 4, "model": "vgg16", "iterations": 40},
             {"arrival_s": 2.0, "gpus": 2, "model": "resnet50", "iterations": 20}]
    est = tc.estimates(rack, trace)
    assert len(est) == 3 and all(e > 0 for e in est)
    assert est[1] == pytest.approx(2 * est[0], rel=1e-12) and est[2] != pytest.approx(est[0])

    from simulator.model.schedview import SchedulerView

    seen, real = {}, SchedulerView.estimate

    def estimate(view, key):  # what the simulated backfill reads of a job that waits in its queue
        value = real(view, key)
        if key in view.run.queue:
            seen.setdefault(key, value)
        return value

    first = [{"arrival_s": 0.0, "gpus": 12, "model": "vgg16", "iterations": 20},  # 4 of the 16 GPUs left free
             {"arrival_s": 0.0, "gpus": 8, "model": "vgg16", "iterations": 20}]  # waits: the rest may backfill
    trace = first + trace
    expected = tc.estimates(rack, trace)
    monkeypatch.setattr(SchedulerView, "estimate", estimate)
    tc.simulate(rack, trace, "fixed", 300.0, scheduler="backfill")
    assert seen and all(seen[k] == expected[k] for k in seen), (seen, expected)


def test_a_replayed_jobs_row_counts_its_circuit_changes_in_rack_seconds():
    job = {"id": "job-3", "state": "done", "created_at": 100.0, "admitted_at": 101.0, "started_at": 104.0,
           "ended_at": 140.0, "gpus": ["gpu1", "gpu5"], "switches": ["as1"], "circuits": [], "events": [7, 9],
           "iterations_done": 2,
           "iteration_log": [{"t_start": 106.0, "iter_s": 2.0}, {"t_start": 108.0, "iter_s": 4.0}]}
    events = {7: {"removed": [["ocs1:1", "ocs1:11"]], "added": [["ocs1:1", "ocs1:21"]]}, 9: {"added": [["a", "b"]]}}
    row = rt.job_row(2, {"gpus": 2, "model": "vgg16", "iterations": 2, "arrival_s": 0.0}, job, events, 100.0, 2.0)
    assert (row["submit_s"], row["admit_s"], row["start_s"], row["first_iteration_s"], row["end_s"]) == \
        (0.0, 0.5, 2.0, 3.0, 20.0)
    assert row["circuit_changes"] == 3 and row["mean_iteration_s"] == pytest.approx(1.5)


def test_the_replay_refuses_bad_input_before_touching_the_rack(capsys):
    assert rt.main(["--policies", "fixed,bogus"]) == 2
    assert rt.main(["--jobs", "0"]) == 2
    assert rt.main(["--trace", "/nonexistent.csv"]) == 2
    assert rt.main(["--queue", "las"]) == 2  # the controller does not offer it
    assert "replay_trace:" in capsys.readouterr().err


def test_the_replay_says_open_vswitch_is_not_running_and_starts_nothing(monkeypatch, capsys):
    from emulation import ovs
    from emulation.netns import NetnsError

    def refused(*cmd, check=True):
        raise NetnsError(f"{' '.join(cmd)}: ovs-vsctl: unix:/var/run/openvswitch/db.sock: database connection failed")
    monkeypatch.setattr(ovs, "run", refused)
    monkeypatch.setattr(rt, "replay", lambda *a, **k: pytest.fail("a replay was started"))
    assert rt.main(["--no-record", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "Open vSwitch is not running" in err and "make setup" in err


def test_start_delays_are_each_jobs_start_to_first_iteration_and_the_cli_refuses_a_bad_record(tmp_path, capsys):
    run = {"jobs": [{"start_s": 1.0, "first_iteration_s": 6.0}, {"start_s": 2.0, "first_iteration_s": None}]}
    assert tc.start_delays(run) == [5.0]
    bad = tmp_path / "r.json"
    bad.write_text("{}")
    assert tc.main([str(bad)]) == 2 and "tracecheck:" in capsys.readouterr().err


def test_on_the_bursty_trace_the_start_order_fails_a_simulation_of_the_wrong_discipline():
    """Under FIFO both sides start jobs in arrival order, so the start order cannot fail there; on trace16-bursty.csv
    EASY backfill starts them in another order, so a replay under backfill judged by a simulation under fifo (the
    deliberately wrong discipline) fails it, and the check simulates the discipline the record names."""
    from pathlib import Path

    from evidence import tracebars
    from simulator.inputs.workloads import read_trace

    root = Path(__file__).resolve().parents[2]
    rack = root / "topologies" / "trace16.yaml"
    trace = [{"arrival_s": j.arrival_s, "gpus": j.gpus, "model": j.model, "iterations": j.iterations}
             for j in sorted(read_trace(root / "traces" / "trace16-bursty.csv"), key=lambda j: j.arrival_s)]
    backfill, _ = tc.simulate(rack, trace, "fixed", 300.0, scheduler="backfill")
    fifo, _ = tc.simulate(rack, trace, "fixed", 300.0)
    wrong = tc.compare(backfill, fifo, 0, 0)
    assert not wrong["start_order_same"] and len(wrong["start_order_discordant"]) >= 5
    assert any(x.startswith("start order differs") for x in tracebars.literal(wrong, tracebars.newest()))
    jobs = [{"index": r["index"], "submit_s": r["arrival_s"], "admit_s": r["admit_s"], "start_s": r["start_s"],
             "end_s": r["end_s"], "state": "done"} for r in backfill]
    record = {"jobs_replayed": len(trace), "policies": {"fixed": {"jobs": jobs, "summary": {"circuit_changes": 0},
                                                                  "scheduler": "backfill"}}}
    assert tc.compare_record(record, trace, rack)["fixed"]["start_order_same"]
    del record["policies"]["fixed"]["scheduler"]  # a record without one ran fifo: judged so, the order differs
    assert not tc.compare_record(record, trace, rack)["fixed"]["start_order_same"]


def test_a_record_is_checked_against_the_trace_it_replayed_not_a_default(tmp_path):
    import hashlib

    from evidence.tracecheck import record_trace

    root = Path(__file__).resolve().parents[2]
    bursty = root / "traces" / "trace16-bursty.csv"
    sha = hashlib.sha256(bursty.read_bytes()).hexdigest()
    # written on another machine: found by its name under traces/, its bytes checked
    assert record_trace({"trace_file": "/elsewhere/traces/trace16-bursty.csv", "trace_sha256": sha}, root) == bursty
    with pytest.raises(ValueError, match="not the trace the record replayed"):
        record_trace({"trace_file": "/elsewhere/traces/trace16.csv", "trace_sha256": sha}, root)
    with pytest.raises(KeyError, match="give --trace"):
        record_trace({}, root)


class _ProbeClient:
    """The REST calls the host's probe makes, against a controller whose jobs end as `states` say (pure logic)."""

    def __init__(self, states: list[str]):
        self.states, self.posted, self.jobs = list(states), [], {}

    def post(self, path: str, body: dict) -> dict:
        assert path == "/jobs"
        jid = f"j{len(self.posted) + 1}"
        self.posted.append(body)
        self.jobs[jid] = {"id": jid, "state": "running", "created_at": 100.0 * len(self.posted),
                          "admitted_at": 100.0 * len(self.posted) + 0.5, "started_at": 100.0 * len(self.posted) + 1.5,
                          "ended_at": 100.0 * len(self.posted) + 9.0, "gpus": ["gpu1"],
                          "iteration_log": [{"t_start": 100.0 * len(self.posted) + 4.0, "iter_s": 0.2}]}
        return {"job": self.jobs[jid]}

    def get(self, path: str) -> dict:
        job = self.jobs[path.rsplit("/", 1)[1]]
        if job["state"] == "running":  # ends at its second look
            job["state"] = "ending"
        elif job["state"] == "ending":
            job["state"] = self.states.pop(0)
        return {"job": job}


def test_the_hosts_probe_runs_each_job_alone_fixed_and_keeps_its_phases_from_its_own_submission():
    client = _ProbeClient(["done"] * len(rt.PROBE))
    rows = rt.probe(client, 2.0)
    assert [b["name"] for b in client.posted] == [f"probe {i + 1}" for i in range(len(rt.PROBE))]
    assert all(b["policy"] == "fixed" and b["checkpoint_every"] == b["workload"]["iterations"] for b in client.posted)
    assert [(r["gpus_asked"], r["model"]) for r in rows] == [(p["gpus"], p["model"]) for p in rt.PROBE]
    r = rows[1]  # rack s from its own submission: (t - created_at) / dilation
    assert (r["submit_s"], r["admit_s"], r["start_s"], r["first_iteration_s"], r["end_s"]) == (0.0, 0.25, 0.75, 2.0,
                                                                                                4.5)
    assert r["mean_iteration_s"] == pytest.approx(0.1)


@pytest.mark.parametrize("queue", ["fifo", "backfill", "sjf"])
def test_the_probe_sends_an_estimate_where_the_controllers_queue_needs_one(queue):
    """A controller that queues by backfill or sjf refuses a job without estimate_s (controller/jobs/admission.py):
    the probe's jobs carry their time bound there, and nothing under fifo."""
    from controller.core.jobs import JobRequest

    client = _ProbeClient(["done"] * len(rt.PROBE))
    rt.probe(client, 2.0, queue)
    estimates = {b.get("estimate_s") for b in client.posted}
    assert estimates == ({None} if queue == "fifo" else {rt.PROBE_TIMEOUT_S})
    for body in client.posted:
        assert JobRequest.model_validate(body).estimate_s == body.get("estimate_s")


def test_a_probe_job_that_fails_fails_the_replay_naming_it():
    client = _ProbeClient(["failed"])
    with pytest.raises(RuntimeError, match=r"probe 1 \(1 x resnet50\) ended failed"):
        rt.probe(client, 2.0)
    assert len(client.posted) == 1  # nothing more is submitted

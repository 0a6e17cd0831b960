"""The simulator against the emulation: the demo's recorded mean iteration times, each point within 15 %.

One test id per point; the points still outside 15 % are marked xfail(strict=True) in KNOWN_GAPS with
their measured gap and the suspected mechanism (README, "Against the emulation").

Reads the results/paper-experiment.json committed with the repository (make demo writes it; .gitignore
keeps exactly that file); the emulation is not run here. Without the file the comparison skips,
saying why, except in CI, where it must exist. Whatever the checkout, the comparison also runs on
tests/data/demo-readme-run.json: the figures of the demo run the README quotes, against the table the
README prints for them.
"""
import json
import os
from pathlib import Path

import pytest

from simulator import calibration, fidelity
from simulator.rings import Ring, iteration_time

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "results" / "paper-experiment.json"
README_RUN = ROOT / "tests" / "data" / "demo-readme-run.json"


def record():
    if not RECORD.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{RECORD} is missing: CI must compare the simulator with the committed demo record")
        pytest.skip(f"{RECORD} is absent in this checkout: run make demo and commit it (.gitignore lets that one file "
                    "in); CI fails without it")
    return json.loads(RECORD.read_text())


def point_id(case: str, uplink_gbps: float, policy: str) -> str:
    return f"case-{case}-uplink-{uplink_gbps:g}G-{'fragmented' if policy == 'fixed' else 'regrouped'}"


# Points of the committed record still outside the tolerance, each with its measured gap. Strict: the
# test fails once a point comes within 15 % (the mark must then go). The suspected mechanism, from the
# record itself (python -m simulator.evidence; README "Against the emulation"): at the shallow uplink
# queue it shares with the job beside, each crossing TCP flow's sender sends 31-45 % more bytes than its
# receiver gets (the uncontended flows: 0-0.5 %), and the ring gets 41-55 % of the uplink's line rate
# at every rate, not the spare capacity the job beside leaves in its compute phase, which the
# simulator's max-min sharing hands over (56-76 %).
LOSSY_UPLINK = ("the emulated ring's crossing TCP flows send 31-45 % more bytes than they deliver (drops at the "
                "shallow uplink queue shared with the job beside) and get {emu} of the uplink's line rate while "
                "communicating where max-min sharing gives {sim}; the simulator does not model TCP loss recovery")
KNOWN_GAPS = {
    point_id("b", 13.8, "fixed"): "-19.5 % (1.157 s emulated, 0.931 s simulated): "
    + LOSSY_UPLINK.format(emu="46 %", sim="60 %") + "; its job beside mixes Titan V and M40 ranks, whose fast "
    "ranks start sending before its slowest finishes computing (the simulator starts a ring's steps together)",
    point_id("a", 50.0, "fixed"): "-23.3 % (0.546 s emulated, 0.418 s simulated): "
    + LOSSY_UPLINK.format(emu="41 %", sim="68 %"),
    point_id("a", 25.0, "fixed"): "-17.1 % (0.794 s emulated, 0.658 s simulated): "
    + LOSSY_UPLINK.format(emu="47 %", sim="61 %"),
}


def _params():
    if not RECORD.exists():
        return [pytest.param(None, id="no-record")]
    out = []
    for p in fidelity.points(json.loads(RECORD.read_text())):
        pid = point_id(p.case, p.uplink_gbps, p.policy)
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[pid])] if pid in KNOWN_GAPS else []
        out.append(pytest.param(pid, id=pid, marks=marks))
    return out


@pytest.fixture(scope="module")
def compared():
    rec = record()
    rows, cal = fidelity.compare(rec)
    return rec, {point_id(p.case, p.uplink_gbps, p.policy): p for p in rows}, fidelity.table(rows, cal)


def test_the_record_holds_every_point_the_comparison_needs(compared):
    rec, rows, _ = compared
    at_rack = {(p.case, p.policy) for p in rows.values() if "demo rack" in p.label}
    assert at_rack == {("a", "fixed"), ("a", "regroup"), ("b", "fixed"), ("b", "regroup")}
    swept = {p.uplink_gbps for p in rows.values() if p.case == "a"}
    assert {s["uplink_gbps"] for s in rec.get("sweep", [])} <= swept
    assert set(KNOWN_GAPS) <= set(rows), "a known gap names a point the record does not hold"


@pytest.mark.parametrize("pid", _params())
def test_simulated_iteration_time_is_within_15_percent_of_the_emulated_median(compared, pid):
    _, rows, table = compared
    p = rows[pid]
    assert abs(p.error) <= fidelity.TOLERANCE, f"{pid}: {100 * p.error:+.1f} %\n{table}"


# README.md, "Against the emulation": (emulated, simulated) mean iteration in rack seconds, case (a)
README_TABLE = {(100.0, "fixed"): (0.321, 0.308), (100.0, "regroup"): (0.298, 0.284),
                (50.0, "fixed"): (0.416, 0.428), (50.0, "regroup"): (0.293, 0.284),
                (25.0, "fixed"): (0.604, 0.692), (25.0, "regroup"): (0.292, 0.284),
                (12.5, "fixed"): (1.044, 1.248), (12.5, "regroup"): (0.301, 0.284)}


def test_the_readme_comparison_is_what_the_simulator_gives_for_the_run_it_quotes():
    """A fresh clone compares too: the README's demo run, every point as the README's table states it."""
    rec = json.loads(README_RUN.read_text())
    rows, cal = fidelity.compare(rec)
    assert cal == calibration.PROVISIONAL  # that run recorded no calibration
    got = {(p.uplink_gbps, p.policy): (p.emulated_s, round(p.simulated_s, 3)) for p in rows}
    assert got == README_TABLE, "\n" + fidelity.table(rows, cal)
    # the uncontended ring, the model's closed form, holds at every uplink rate
    assert all(abs(p.error) <= fidelity.TOLERANCE for p in rows if p.policy == "regroup")


def test_the_recorded_points_are_read_as_the_demo_wrote_them():
    rack = {"switches": [{"uplinks": [{"rate_gbps": 40}]}, {"uplinks": [{"rate_gbps": 40}]}]}

    def s(policy, *its):
        return {"policy": policy, "runs": [{"mean_iteration_rack_s": x} for x in its]}

    rec = {"rack": rack, "runs": [{"case": "a", "summary": s("fixed", 0.5, 0.7, 0.6)},
                                  {"case": "a", "summary": s("regroup", 0.3, 0.3)},
                                  {"case": "b", "summary": s("fixed", 0.4)}],
           "sweep": [{"nic_to_uplink": 2.5, "uplink_gbps": 40, "fixed": s("fixed", 9), "regroup": s("regroup", 9)},
                     {"nic_to_uplink": 4, "uplink_gbps": 25, "fixed": s("fixed", 0.9, 1.1), "regroup": s("regroup", 0.3)}]}
    got = [(p.case, p.uplink_gbps, p.policy, p.emulated_s, len(p.runs)) for p in fidelity.points(rec)]
    # the sweep point at the demo rack's own uplink is the case (a) run, compared once
    assert got == [("a", 40, "fixed", 0.6, 3), ("a", 40, "regroup", 0.3, 2), ("b", 40, "fixed", 0.4, 1),
                   ("a", 25, "fixed", 1.0, 2), ("a", 25, "regroup", 0.3, 1)]


def test_the_demos_repeated_points_and_calibration_are_read():
    """The record with repeats: medians per point, the fitted point once, the calibration at the rate used."""
    def fig(*its):
        return {"mean_iteration_rack_s": sorted(its)[len(its) // 2], "mean_iteration_rack_s_values": list(its)}

    def point(name, case, k, uplink, fixed, regroup):
        return {"name": name, "case": case, "nic_to_uplink": k, "uplink_gbps": uplink, "fixed": fixed, "regroup": regroup}

    main_a = point("case a", "a", 5.0, 20.0, fig(1.0, 1.2, 1.1), fig(0.3, 0.3, 0.31))
    rack = {"servers": [{"gpus": [{"nic": {"rate_gbps": 100}}]}], "emulation": {"rate_scale": 0.001}}
    rec = {"rack": rack, "rate_scale": 0.0005,
           "points": [main_a, point("case b", "b", 5.0, 20.0, fig(0.9), fig(0.28))],
           "sweep": [point("sweep 1:2", "a", 2, 50.0, fig(0.5), fig(0.3)), {**main_a, "name": "fitted 1:5"}],
           "calibration": {"runs": [{"rate_mbps": 100.0, "fraction": 0.5},  # at the rate it gave up on
                                    {"rate_mbps": 50.0, "fraction": 0.93}, {"rate_mbps": 50.0, "fraction": 0.95},
                                    {"rate_mbps": 50.0, "fraction": 0.97}]}}
    got = [(p.case, p.uplink_gbps, p.policy, p.emulated_s, len(p.runs)) for p in fidelity.points(rec)]
    assert got == [("a", 20.0, "fixed", 1.1, 3), ("a", 20.0, "regroup", 0.3, 3), ("b", 20.0, "fixed", 0.9, 1),
                   ("b", 20.0, "regroup", 0.28, 1), ("a", 50.0, "fixed", 0.5, 1), ("a", 50.0, "regroup", 0.3, 1)]
    cal = calibration.from_record(rec)
    assert cal.efficiency == pytest.approx(0.95) and cal.step_latency_emulated_s == calibration.LOOPBACK_STEP_S
    assert calibration.from_record({"runs": []}) == calibration.PROVISIONAL


def test_calibration_takes_the_per_step_latency_out_of_a_measured_ring():
    # a ring of 4 that runs at 90 % of line rate and pays 5 ms per step
    n, size, rate, latency = 4, 8e6, 50e6, 0.005
    steps = 2 * (n - 1)
    measured = steps * ((size / n) * 8 / (0.9 * rate) + latency)
    bound = steps * (size / n) * 8 / rate
    assert calibration.efficiency_from_ring(bound / measured, n, size, rate, latency) == pytest.approx(0.9)


def test_a_regrouped_ring_of_the_paper_takes_its_closed_form_time():
    """Case (a) regrouped: nothing shares its links, so the simulated iteration is compute + 6 steps."""
    from controller.core.rack import load_rack
    from simulator.engine import Options, Run, policies
    from simulator.workloads import paper_case

    rack = load_rack(ROOT / "topologies" / "paper-testbed.yaml")
    cal = calibration.PROVISIONAL
    net = cal.net(rack)
    result = Run(rack, paper_case("a", 20), policies(300)["regroup"], Options(net=net, step_model="exact")).run()
    job = result.jobs[0]
    ring = Ring(0, 0.12862 * 11 / 7, 0, 4, 138_357_544 * 4, 100e9 / 8 * net.efficiency)
    assert job.mean_iteration_s == pytest.approx(iteration_time(ring, ring.cap, net.step_latency_s), rel=1e-6)


def test_the_evidence_reads_resent_bytes_and_crossings_from_a_record():
    """simulator/evidence.py on a made-up record: gpu1 -> gpu2 crosses (two switches) and its sender sends 1.5 x
    what gpu2 receives; gpu2 -> gpu1 crosses back, nothing resent, and its one comm window is stalled."""
    from simulator import evidence

    rack = {"servers": [{"gpus": [{"name": "gpu1", "nic": {"rate_gbps": 100, "ocs_port": "o:1"}}]},
                        {"gpus": [{"name": "gpu2", "nic": {"rate_gbps": 100, "ocs_port": "o:2"}}]}],
            "switches": [{"name": "as1", "downlinks": [{"ocs_port": "o:11"}], "uplinks": [{"rate_gbps": 10}]},
                         {"name": "as2", "downlinks": [{"ocs_port": "o:21"}], "uplinks": [{"rate_gbps": 10}]}],
            "circuits": [["o:1", "o:11"], ["o:2", "o:21"]], "emulation": {"rate_scale": 0.001}}
    assert evidence.gpu_switches(rack) == {"gpu1": "as1", "gpu2": "as2"}

    def samples(tx, rx):
        return [{"t": 0.0, "tx_bps": 0, "rx_bps": 0}, {"t": 1.0, "tx_bps": tx, "rx_bps": rx}]

    ranks = {g: [{"t_start": -1.0, "compute_s": 0.5, "t_end": 2.0}] for g in ("gpu1", "gpu2")}
    job = {"gpus": ["gpu1", "gpu2"], "ranks": ranks, "switches": ["as2"],
           "throughput": {"gpu1": samples(3e6, 4e5), "gpu2": samples(4e5, 2e6)}}
    rec = {"rack": rack, "runs": [{"tag": "t", "summary": {"policy": "fixed"}, "job": job},
                                  {"tag": "r", "summary": {"policy": "regroup"}, "job": job}]}
    got = [(f.src, f.dst, f.crossing, round(f.sent_over_delivered, 3), f.stalled_windows) for f in evidence.flows(rec)]
    # uplink: 10 Gbit/s x 0.001 = 10 Mbit/s; gpu1's 2 Mbit/s reach gpu2 (20 %), gpu2's 0.4 Mbit/s gpu1 (4 %: stalled)
    assert got[:2] == [("gpu1", "gpu2", True, 1.5, 0.0), ("gpu2", "gpu1", True, 1.0, 1.0)]
    # the same job regrouped (under as2): nothing crosses
    assert [f.crossing for f in evidence.flows(rec)[2:]] == [False, False]


def test_the_evidence_command_names_a_bad_record(tmp_path, capsys):
    from simulator import evidence

    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert evidence.main([str(bad)]) == 2
    assert "not a make demo record" in capsys.readouterr().err
    assert evidence.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read the record" in capsys.readouterr().err

"""The neighbours' mechanisms (simulator/model/neighbours.py) on small cases worked by hand: ODDL's 2-D WSS grid and a
4-node ring step's circuit set-up, an aggregation tree's streams per link (PANAMA at every switch, SwitchML-like at
the root only), and what each does to an iteration in the engine."""
from __future__ import annotations

import pytest

from profiles import WORKLOADS, compute_seconds
from simulator.cli import report
from simulator.inputs.racks import RackOptions, generate
from simulator.inputs.workloads import JobSpec
from simulator.model import neighbours, sharing, shortflows
from simulator.model.detail import Detail, RingState
from simulator.model.engine import Options, policies
from simulator.model.network import GBPS
from simulator.model.rings import Ring

EFF, LAT = Options().net.efficiency, Options().net.step_latency_s


DEFAULT = neighbours.Params()


def one(rack, policy, job, params=DEFAULT):
    pol = {**policies(300.0), **neighbours.policies(params)}[policy]
    return neighbours.run_class(pol)(rack, [job], pol, Options()).run().jobs[0]


def test_oddl_grid_sizes_as_the_paper():
    assert neighbours.oddl_wss(1024) == (64, 32)  # 64 WSSs of 32 ports
    assert neighbours.oddl_wss(4096) == (128, 64)  # 128 of 64
    assert neighbours.oddl_side(4) == 2 and neighbours.oddl_side(5) == 3


def test_oddl_hops_on_a_2x2_grid():
    # nodes 0 (0,0), 1 (0,1), 2 (1,0), 3 (1,1)
    assert neighbours.oddl_hops(0, 1, 2) == 1  # same row
    assert neighbours.oddl_hops(0, 2, 2) == 1  # same column
    assert neighbours.oddl_hops(1, 2, 2) == 2  # neither: relayed
    assert neighbours.oddl_hops(3, 0, 2) == 2


def test_oddl_four_node_ring_step():
    """Ring 0->1->2->3->0 on 2x2: flows 1->2 and 3->0 need two circuits, so a step waits 2 x (switch + control)."""
    p = neighbours.Params(oddl_switch_s=10.5e-9, oddl_control_s=1e-6)
    assert neighbours.oddl_step_setup_s([0, 1, 2, 3], 2, p) == pytest.approx(2 * 1.0105e-6)
    assert neighbours.oddl_step_setup_s([0, 1, 3, 2], 2, p) == pytest.approx(1.0105e-6)  # around the square


def test_oddl_iteration_in_the_engine():
    """4 GPUs, ResNet50, 10 iterations: each of the 6 steps moves S/4 at the NIC's rate and sets up its circuits
    (2 hops: rank order g1..g4 is 0,1,2,3); the one-tier electrical switch (ideal) has no set-up."""
    rack = generate(RackOptions(4, gpus_per_switch=4, gpus_per_server=1, oversubscription=1,
                                models=(("V100", 1.0),), spare=1.0))
    p = neighbours.Params(oddl_switch_s=1e-3, oddl_control_s=0.0)  # ms switching, to see it
    job = JobSpec("a", 0.0, 4, "resnet50", 10)
    s = WORKLOADS["resnet50"].gradient_bytes
    step = s / 4 / (100 * GBPS * EFF) + LAT
    compute = compute_seconds("resnet50", "V100")
    electrical = one(rack, "ideal", job)
    oddl = one(rack, "oddl", job, p)
    assert oddl.placement == ("g1", "g2", "g3", "g4")
    assert electrical.end_s - electrical.start_s == pytest.approx(10 * (compute + 6 * step))
    assert oddl.end_s - oddl.start_s == pytest.approx(10 * (compute + 6 * (step + 2e-3)))


def _route(a, b):
    """Two-tier: switch x's uplink is 'x^', its downlink from the core 'x_'."""
    return (f"{a}^", f"{b}_")


def test_aggregation_tree_streams_per_link():
    """Three switches a (root), b, c. At every switch (PANAMA): each link of the tree one stream. At the root only
    (SwitchML-like): b's and c's streams both cross the core's link down to a, and both results come back up."""
    assert neighbours.tree_links(["a", "b", "c"], _route, root_only=False) == {
        "b^": 1, "a_": 1, "a^": 1, "b_": 1, "c^": 1, "c_": 1}
    assert neighbours.tree_links(["a", "b", "c"], _route, root_only=True) == {
        "b^": 1, "a_": 2, "a^": 2, "b_": 1, "c^": 1, "c_": 1}
    assert neighbours.tree_links(["a"], _route, root_only=True) == {}
    # one aggregator at the root, none on the way (ina-root): a stream per GPU under each other switch
    assert neighbours.tree_links(["a", "b", "c"], _route, root_only=True, streams=[1, 2, 3]) == {
        "b^": 2, "a_": 5, "a^": 5, "b_": 2, "c^": 3, "c_": 3}


def test_aggregation_halves_the_bytes_and_the_root_link_limits_a_single_tree():
    """12 GPUs on 3 switches, uplinks at one NIC's rate. Ring: 22 steps of S/12 at the NIC rate (one flow per
    uplink). PANAMA: each GPU sends S once (one step, one stream per link). SwitchML-like: the root's core link
    carries 2 streams, so S at half an uplink's rate."""
    rack = generate(RackOptions(12, gpus_per_switch=4, gpus_per_server=1, oversubscription=4,
                                models=(("V100", 1.0),), spare=1.0))
    job = JobSpec("a", 0.0, 12, "resnet50", 10, names=tuple(rack.gpus))
    s, rate = WORKLOADS["resnet50"].gradient_bytes, 100 * GBPS * EFF
    compute = compute_seconds("resnet50", "V100")
    ring, panama, single = (one(rack, p, job) for p in ("regroup", "panama", "switchml"))
    assert ring.switches == panama.switches == single.switches == 3
    assert ring.end_s - ring.start_s == pytest.approx(10 * (compute + 22 * (s / 12 / rate + LAT)))
    assert panama.end_s - panama.start_s == pytest.approx(10 * (compute + s / rate + LAT))
    assert single.end_s - single.start_s == pytest.approx(10 * (compute + s / (rate / 2) + LAT))


def test_one_aggregator_at_the_root_carries_a_stream_per_gpu_of_the_other_switches():
    """The emulated rack's aggregator (ina-root): the same 12 GPUs on 3 switches; the 8 GPUs under the other two each
    stream S to the root's aggregator across the root's core link, and get the sum back: S at an eighth of an
    uplink's rate, where the single tree aggregates each switch's four first (half)."""
    rack = generate(RackOptions(12, gpus_per_switch=4, gpus_per_server=1, oversubscription=4,
                                models=(("V100", 1.0),), spare=1.0))
    job = JobSpec("a", 0.0, 12, "resnet50", 10, names=tuple(rack.gpus))
    s, rate = WORKLOADS["resnet50"].gradient_bytes, 100 * GBPS * EFF
    compute = compute_seconds("resnet50", "V100")
    pol = neighbours.NeighbourPolicy("agg", "regroup", collective="ina-root")
    root = neighbours.run_class(pol)(rack, [job], pol, Options()).run().jobs[0]
    assert root.switches == 3
    assert root.end_s - root.start_s == pytest.approx(10 * (compute + s / (rate / 8) + LAT))
    ring = neighbours.Ring("r", 0.1, 0.0, 4, s, rate)
    with pytest.raises(ValueError, match="ina-root needs the job's GPUs under each of its switches"):
        neighbours.adapt(ring, "", "ina-root", DEFAULT, EFF, switches=["a", "b"], route=_route)


def test_topoopt_and_sipml_rates():
    rack = generate(RackOptions(4, gpus_per_switch=4, gpus_per_server=1, oversubscription=1,
                                models=(("V100", 1.0),), spare=1.0))
    job = JobSpec("a", 0.0, 4, "resnet50", 10)
    s, compute = WORKLOADS["resnet50"].gradient_bytes, compute_seconds("resnet50", "V100")
    p = neighbours.Params(topoopt_degree=4, sipml_gbps=1000.0, sipml_setup_s=1e-4)
    topo = one(rack, "topoopt", job, p)
    assert topo.end_s - topo.start_s == pytest.approx(10 * (compute + 6 * (s / 4 / (400 * GBPS * EFF) + LAT)))
    sip = one(rack, "sipml", job, p)
    assert sip.end_s - sip.start_s == pytest.approx(10 * (compute + 6 * (s / 4 / (1000 * GBPS * EFF) + LAT + 1e-4)))


def test_bad_parameters_are_refused():
    """Each error names the flag that sets the parameter, and the value in the flag's unit."""
    with pytest.raises(ValueError, match="--topoopt-degree must be at least 1, not 0"):
        neighbours.Params(topoopt_degree=0).check()
    with pytest.raises(ValueError, match="--oddl-switch-ns must be a finite time of 0 or more, not -1$"):
        neighbours.Params(oddl_switch_s=-1e-9).check()
    with pytest.raises(ValueError, match="--mltcp-slope"):
        neighbours.Params(mltcp_slope=float("inf")).check()


def test_unfair_sharing_interleaves_two_equal_jobs():
    """Two jobs of 1 s compute and 1 s of traffic, started together. Fair: both send at half rate (2 s), then
    compute together: 3 s an iteration. 60/40: the favoured one finishes first and computes while the other
    sends; they settle into turns, 2 s an iteration (the link always busy, each job's compute hidden)."""
    jobs = [sharing.Job("a", 1.0, 1.0), sharing.Job("b", 1.0, 1.0)]
    assert sharing.run(jobs, [1.0, 1.0], iterations=60) == pytest.approx([3.0, 3.0])
    assert sharing.run(jobs, [0.6, 0.4], iterations=60) == pytest.approx([2.0, 2.0], rel=1e-4)
    offsets, shifted = sharing.best_offsets(jobs)  # CASSINI: start b 1 s later, fair shares then never meet
    assert offsets[1] == pytest.approx(1.0, abs=2 / 24) and shifted == pytest.approx([2.0, 2.0], rel=1e-3)


def test_weighted_max_min_by_hand():
    """One link of 1.0: weights 1 and 3 split it 1/4 and 3/4; capped at 0.5, the heavier one leaves the rest to the
    other. Ring 2 also on a second link of 0.2 is held there; ring 1 takes what it leaves."""
    assert sharing.weighted_max_min({1: 1.0, 2: 3.0}, {1: 9.0, 2: 9.0}, {1: {0: 1}, 2: {0: 1}}, [1.0]) == \
        pytest.approx({1: 0.25, 2: 0.75})
    assert sharing.weighted_max_min({1: 1.0, 2: 3.0}, {1: 9.0, 2: 0.5}, {1: {0: 1}, 2: {0: 1}}, [1.0]) == \
        pytest.approx({1: 0.5, 2: 0.5})
    assert sharing.weighted_max_min({1: 1.0, 2: 3.0}, {1: 9.0, 2: 9.0}, {1: {0: 1}, 2: {0: 1, 1: 1}}, [1.0, 0.2]) == \
        pytest.approx({1: 0.8, 2: 0.2})


def _pair(offset, mltcp, coarse):
    """Two rings of 2 ranks on one link of 1 byte/s: 1 s compute, 2 steps of 0.5 byte (1 s alone), no latency; the
    second `offset` s behind. Their iteration times over iterations 40-60."""
    rings = [Ring(k, 1.0, 1.0, 2, 1.0, 1.0, {0: 1}, coarse) for k in (0, 1)]
    states = {0: RingState(remaining=1.0), 1: RingState(remaining=1.0 + offset)}
    d = sharing.MltcpDetail(rings, [1.0], 0.0, states, slope=2.0, levels=16) if mltcp else \
        Detail(rings, [1.0], 0.0, states)
    d.run(0.0, 1e9, window={0: 60, 1: 60})
    return [(s.ends[59] - s.ends[39]) / 20 for s in d.states.values()]


@pytest.mark.parametrize("coarse", [True, False])
def test_mltcp_interleaves_two_identical_jobs_on_one_link(coarse):
    """Fair, the second 0.1 s behind: the first sends alone 0.1 s, then both at half rate until it is done
    (1.8 s), the second alone its last 0.1 s: 2.9 s an iteration, the offset held for ever. MLTCP: the one ahead
    has sent more, so weighs more, finishes sooner and computes while the other sends; the gap grows until they
    take turns: 2 s an iteration (compute 1 s hidden under the other's 1 s of traffic). Started together they stay
    together (the fluid model has no noise to break the tie): 3 s, as fair."""
    assert _pair(0.1, False, coarse) == pytest.approx([2.9, 2.9])
    assert _pair(0.1, True, coarse) == pytest.approx([2.0, 2.0], rel=1e-6)
    assert _pair(0.0, True, coarse) == pytest.approx([3.0, 3.0])


def test_mltcp_in_the_engine_beside_regroup():
    """Two ResNet50 rings of 4 on 2 switches (g1,g2,g5,g6 and g3,g4,g7,g8), uplinks at one NIC's rate, the second 1
    ms later: both cross the same uplinks with one flow each. Fair (regroup): compute c + 2T - 1 ms (T: the all-reduce
    alone); MLTCP: c + T once interleaved (the mean over 300 iterations, the transient included)."""
    rack = generate(RackOptions(8, gpus_per_switch=4, gpus_per_server=1, oversubscription=4,
                                models=(("V100", 1.0),), spare=1.0))
    jobs = [JobSpec("a", 0.0, 4, "resnet50", 300, names=("g1", "g2", "g5", "g6"), policy="fixed"),
            JobSpec("b", 1e-3, 4, "resnet50", 300, names=("g3", "g4", "g7", "g8"), policy="fixed")]
    s, c = WORKLOADS["resnet50"].gradient_bytes, compute_seconds("resnet50", "V100")
    t = 6 * (s / 4 / (100 * GBPS * EFF) + LAT)
    table = {**policies(300.0), **neighbours.policies()}
    fair, mltcp = (neighbours.run_class(table[p])(rack, jobs, table[p], Options()).run() for p in ("regroup", "mltcp"))
    assert all(j.shared for j in fair.jobs + mltcp.jobs)
    assert [j.mean_iteration_s for j in fair.jobs] == pytest.approx([c + 2 * t - 1e-3] * 2, rel=5e-3)
    assert [j.mean_iteration_s for j in mltcp.jobs] == pytest.approx([c + t] * 2, rel=2e-3)
    assert mltcp.stats["mltcp"]["other"] == ["a", "b"]  # contended, one period, a link with pauses: it could gain
    gain = neighbours.mltcp_gain(fair, mltcp)
    assert gain["jobs"] == 2 and gain["saved"] > 0.1 and gain["other"] == 2
    assert "sooner" in neighbours.mltcp_text(gain) and "saved nothing" not in neighbours.mltcp_text(gain)


def test_why_mltcp_saves_nothing():
    g = {"jobs": 10, "saved": 0.0, "jct_unshifted_s": 241.0, "jct_shifted_s": 241.0, "iteration_unshifted_s": 0.146,
         "iteration_shifted_s": 0.146, "faster": 5, "fit": 7, "busy": 1, "periods": 2, "other": 0, "mean_field": 0,
         "held": False}
    text = neighbours.mltcp_text(g)
    assert "saved nothing" in text and "7 of 10" in text and "no pause" in text and "drift back" in text
    assert "mean field" not in text
    assert "held" in neighbours.mltcp_text({"held": True})
    assert "0.1 % later" in neighbours.mltcp_text({**g, "saved": -0.001})


def test_why_shifting_saves_nothing():
    same = [sharing.Job("a", 1.0, 1.0), sharing.Job("b", 1.0, 1.0)]
    assert sharing.why_no_gain(same, [3.0, 3.0], [2.0, 2.0]) == ""
    assert "drifts back" in sharing.why_no_gain([sharing.Job("a", 1.0, 1.0), sharing.Job("b", 0.5, 0.2)],
                                                [2.0, 1.0], [2.0, 1.0])
    busy = [sharing.Job("a", 0.5, 1.0), sharing.Job("b", 0.5, 1.0)]
    assert "busy all the time" in sharing.why_no_gain(busy, [2.5, 2.5], [2.5, 2.5])
    ts = {"jobs": 2, "first": 1, "fit": 1, "no_better": 0, "shifted": 0, "held": False, "saved": 0.0}
    text = report.timeshift_why(ts)
    assert "1 of 2 were placed before" in text and "fit every link" in text
    assert "held" in report.timeshift_why({**ts, "held": True})


def test_short_flow_hops_worked_by_hand():
    fab = shortflows.Fabric(rtt_s=10e-6, ecn_bytes=30e3, window_bytes=128e3, buffer_bytes=2e6, short_bytes=7e3)
    rate = 100e9
    assert shortflows.hop_delay(fab, rate, []) == 0.0
    assert shortflows.hop_delay(fab, rate, ["fill", "ecn"]) == pytest.approx(2e6 * 8 / rate)  # TCP fills the buffer
    assert shortflows.hop_delay(fab, rate, ["ecn", "ecn"]) == pytest.approx(30e3 * 8 / rate)  # one threshold
    assert shortflows.hop_delay(fab, rate, ["window", "window"]) == pytest.approx(256e3 * 8 / rate)
    # two hops: an idle one, then one with a SwitchML-like stream: 10 us + 128 kB queued + 7 kB at half the rate
    hops = [(rate, []), (rate, ["window"])]
    assert shortflows.fct(fab, hops) == pytest.approx(10e-6 + 128e3 * 8 / rate + 7e3 * 8 / (rate / 2))
    # no aggregation traffic: every short flow takes the round trip and its bytes at the line rate
    assert shortflows.p99(fab, "ideal", 0.5, samples=200) == pytest.approx(10e-6 + 7e3 * 8 / 100e9)
    with pytest.raises(ValueError, match="collective"):
        shortflows.p99(fab, "tree", 0.5)


def test_report_blocks_read_the_records_and_name_a_missing_one(tmp_path):
    from evidence.report import neighbours as report_neighbours
    from evidence.report.bench import ReportError

    text = report_neighbours.oddl_table1([])  # the committed record
    assert "| training time, ODDL | 97.8 min |" in text
    with pytest.raises(ReportError, match="oddl-table1.json"):
        report_neighbours.oddl_table1([], results=tmp_path)
    assert "MLTCP: " in report_neighbours.why_4096([]) and "Time shifting: " in report_neighbours.why_4096([])
    with pytest.raises(ReportError, match="summary.md"):
        report_neighbours.why_4096([], results=tmp_path)
    (tmp_path / "neighbours").mkdir()
    (tmp_path / "neighbours" / "cassini.json").write_text("{}")
    with pytest.raises(ReportError, match="no rows"):
        report_neighbours.cassini([], results=tmp_path)


def test_simulate_runs_the_neighbours_beside_regroup_with_plots(tmp_path):
    from simulator.cli.main import standalone

    out = tmp_path / "sim"
    assert standalone(["simulate", "--gpus", "64", "--gpus-per-switch", "16", "--jobs", "30", "--policies",
                       "regroup,oddl,panama,switchml,topoopt,sipml,timeshift,mltcp", "--quiet", "--workers", "1",
                       "--out", str(out)]) == 0
    assert (out / "overview.png").stat().st_size > 0
    summary = (out / "summary.md").read_text()
    assert "ODDL: all-optical 2-D WSS" in summary and "in-network aggregation (PANAMA)" in summary
    assert "MLTCP: shares weighted by bytes sent" in summary and "\nMLTCP: " in summary  # its row and its paragraph
    assert standalone(["simulate", "--gpus", "64", "--gpus-per-switch", "16", "--jobs", "3", "--policies", "oddl",
                       "--topoopt-degree", "0", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()
    assert standalone(["simulate", "--gpus", "64", "--gpus-per-switch", "16", "--jobs", "3", "--policies", "mltcp",
                       "--mltcp-slope", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()

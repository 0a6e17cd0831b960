"""The emulated fabric's cost per ring step by chunk size (simulator/model/calibration.py SMALL_STEP_S,
SMALL_CHUNK_BYTES):
each constant is what its committed benchmark records measured, the simulator charges a ring its own step cost
(simulator/model/rings.py Ring.latency_s) in every path, and the demo's rings keep STEP_S."""
from __future__ import annotations

import dataclasses
import json
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from controller.core.rack import load_rack
from evidence import calibration as measured
from simulator.inputs.workloads import JobSpec
from simulator.model import calibration
from simulator.model.columns import Block, Columns, elapsed_of, state_of
from simulator.model.detail import Detail
from simulator.model.engine import Options, Run, policies
from simulator.model.interference import Interference
from simulator.model.network import NetParams
from simulator.model.rings import Ring, iteration_time

ROOT = Path(__file__).resolve().parents[2]
MB = 1e6


def _step(path: str) -> tuple[float, float]:
    """(chunk in emulated bytes, median ms beyond the bound per step) of a bench_allreduce record."""
    r = json.loads((ROOT / path).read_text())["results"]
    return r["gradient_bytes"] / len(r["ring"]), r["step_beyond_bound_ms"]["median"]


def test_the_small_step_and_its_threshold_are_the_benchmarks_measurements():
    small = [_step(p) for p in measured.SMALL_STEP_RECORDS]
    large = [_step(p) for p in measured.LARGE_STEP_RECORDS]
    assert 1000 * calibration.SMALL_STEP_S == pytest.approx(statistics.median(ms for _, ms in small), abs=0.005)
    assert calibration.SMALL_CHUNK_BYTES == pytest.approx(max(c for c, _ in small), rel=1e-9)
    assert all(c > calibration.SMALL_CHUNK_BYTES for c, _ in large)
    # the step up: every chunk above costs several times what any chunk under it does, at either rate
    assert min(ms for _, ms in large) > 3 * max(ms for _, ms in small)
    rates = {json.loads((ROOT / p).read_text())["results"]["line_mbps"] for p in measured.SMALL_STEP_RECORDS}
    assert rates == {25.0, 50.0}


def test_a_chunk_at_or_under_the_threshold_costs_the_small_step_in_rack_units():
    net = NetParams(0.9, 0.005, "maxmin", 0.0002, 1000.0)
    assert net.step_latency(1000.0) == 0.0002 and net.step_latency(1000.5) == 0.005
    assert NetParams(0.9, 0.005).step_latency(1.0) == 0.005  # none set: one cost for every chunk
    with pytest.raises(ValueError, match="small_step_latency_s"):
        NetParams(0.9, 0.005, "maxmin", -1.0, 1000.0)
    cal = calibration.PROVISIONAL
    trace16 = cal.net(load_rack(ROOT / "topologies" / "trace16.yaml"))  # 25 Mbit/s for 100 Gbit/s, dilation 2
    assert trace16.small_chunk_bytes == pytest.approx(25_600 / (0.00025 * 2))
    assert trace16.small_step_latency_s == pytest.approx(calibration.SMALL_STEP_S / 2)
    resnet50, vgg16 = 25_557_032 * 4, 138_357_544 * 4  # gradient bytes
    assert trace16.step_latency(resnet50 / 2) == trace16.small_step_latency_s  # 25.6 kB emulated: measured cheap
    assert trace16.step_latency(vgg16 / 8) == pytest.approx(calibration.STEP_S / 2)  # 34.6 kB: measured dear
    paper = cal.net(load_rack(ROOT / "topologies" / "paper-testbed.yaml"))
    assert all(paper.step_latency(vgg16 / n) == pytest.approx(calibration.STEP_S / 2) for n in (2, 4))  # the demo's


def test_the_engine_charges_each_ring_its_chunks_step_cost():
    rack = load_rack(ROOT / "topologies" / "trace16.yaml")
    net = calibration.PROVISIONAL.net(rack)
    one = dataclasses.replace(net, small_step_latency_s=None)  # the model before: STEP_S for every chunk

    def alone(model: str, gpus: int, params: NetParams) -> float:
        job = JobSpec("j1", 0.0, gpus, model, 20)
        return Run(rack, [job], policies(300.0)["fixed"], Options(net=params, step_model="exact")).run().jobs[0] \
            .mean_iteration_s

    steps = 2 * (4 - 1)
    saved = alone("resnet50", 4, one) - alone("resnet50", 4, net)
    assert saved == pytest.approx(steps * (net.step_latency_s - net.small_step_latency_s), rel=1e-6)
    assert alone("vgg16", 4, one) == pytest.approx(alone("vgg16", 4, net), rel=1e-12)


def _ring(key: int, latency: float | None, links: dict | None = None) -> Ring:
    return Ring(key, 0.05, 0.05, 4, 8 * MB, 10 * MB, links if links is not None else {0: 1}, latency_s=latency)


def test_a_rings_own_step_cost_is_what_every_path_charges_it():
    capacity = [1e12]
    mine, default = _ring(0, 0.001), _ring(1, None, {})
    inter = Interference(capacity, 0.004)
    assert inter.period_alone(mine) == pytest.approx(0.05 + 6 * (2 * MB / (10 * MB) + 0.001))
    assert inter.period_alone(default) == pytest.approx(0.05 + 6 * (2 * MB / (10 * MB) + 0.004))
    d = Detail([mine], capacity, 0.004)
    out = d.run(0.0, 1e9, targets={0: 3})
    assert out.t == pytest.approx(3 * iteration_time(mine, 10 * MB, 0.004))
    # the arrays of a large component take each ring's own latency as the per-ring forms do
    rng = random.Random(3)
    rings = [_ring(k, rng.choice([None, 1e-4, 4e-3]), {k % 5: 1}) for k in range(40)]
    cols = Columns()
    for r in rings:
        cols.set_ring(r, 100, inter._lat(r))
    block = Block([r.key for r in rings], 0.0, cols)
    period = np.array([iteration_time(r, 10 * MB, 0.004) for r in rings])
    p = np.array([rng.uniform(0, 50) for _ in rings])
    phase, remaining, step, done = block.states(p, period, block.latency)
    for i, r in enumerate(rings):
        s = state_of(float(p[i]), r, float(period[i]), inter._lat(r))
        assert (int(phase[i]), float(remaining[i]), int(step[i]), int(done[i])) == (s.phase, s.remaining, s.step,
                                                                                    s.done)
        assert elapsed_of(s, r, float(period[i]), inter._lat(r)) >= 0


def test_the_benchmarks_ring_takes_a_downlink_on_each_gpus_own_ocs_and_refuses_bad_rings(capsys):
    from scripts import bench_allreduce

    rack = load_rack(ROOT / "topologies" / "trace16.yaml")  # gpu3 and gpu4 sit on ocs2
    assert bench_allreduce.ring_circuits(rack, "as1", ["gpu1", "gpu2", "gpu3", "gpu4"]) == [
        ["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs2:1", "ocs2:11"], ["ocs2:2", "ocs2:12"]]
    with pytest.raises(SystemExit, match="no free downlink of as1 on ocs1 for gpu6"):
        bench_allreduce.ring_circuits(rack, "as1", ["gpu1", "gpu2", "gpu5", "gpu6"])  # as1 has 3 on ocs1
    topo = ["--topo", str(ROOT / "topologies" / "trace16.yaml")]
    for beside in ("gpu5,gpu99", "gpu1,gpu5", "gpu5"):
        with pytest.raises(SystemExit) as e:
            bench_allreduce.main([*topo, "--beside", beside])
        assert e.value.code == 2
    assert "--gpus/--beside: distinct GPUs of trace16.yaml" in capsys.readouterr().err

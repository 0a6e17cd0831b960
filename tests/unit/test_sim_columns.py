"""Large components as arrays (simulator/model/columns.py) give the same floats as the per-ring path, and the mean field
over arrays the same as a ring-by-ring loop."""
import dataclasses
import random

import numpy as np
import pytest

from simulator.cli.main import _typical_iteration
from simulator.inputs import racks, workloads
from simulator.model.columns import ALMOST_ONE, Block, Columns, elapsed_of, state_of
from simulator.model.detail import RingState
from simulator.model.engine import Options, Run, policies
from simulator.model.interference import Interference, Limits
from simulator.model.meanfield import ROUNDS, TOLERANCE, mean_field
from simulator.model.models import WORKLOADS
from simulator.model.network import NetParams
from simulator.model.rings import Ring

MB = 1e6


def random_rings(rng: random.Random, count: int, links: int) -> list[Ring]:
    rings = []
    for key in range(count):
        n = rng.choice([1, 2, 3, 4, 8, 16])
        crossed = {} if n == 1 else {link: rng.randint(1, 3) for link in rng.sample(range(links), rng.randint(1, 4))}
        compute = rng.uniform(0.01, 0.3)
        rings.append(Ring(key * 3 + 1, compute, compute * rng.uniform(0.5, 1), n, 10 ** rng.uniform(-3, 2.7) * MB,
                          rng.uniform(5, 100) * MB, crossed, coarse=rng.random() < 0.5))
    return rings


def test_states_and_progress_as_arrays_equal_the_per_ring_forms():
    rng = random.Random(5)
    latency = 4e-3  # beside steps of 10 µs to 10 s: rings in their gaps too
    rings = random_rings(rng, 400, 20)
    cols = Columns()
    for r in rings:
        cols.set_ring(r, 1000)
    block = Block([r.key for r in rings], 0.0, cols)

    def comm(r):
        return 0.0 if not r.steps else r.steps * (r.step_bytes / r.cap + latency) * rng.uniform(1, 3)

    period = np.array([r.compute_s + comm(r) for r in rings])
    p = np.array([rng.choice([0.0, rng.uniform(0, 900), float(rng.randint(0, 50)) - 1e-10]) for _ in rings])
    phase, remaining, step, done = block.states(p, period, latency)
    again = np.array([r.compute_s + comm(r) for r in rings])  # the next solve's periods
    p0 = block.progress(phase, remaining, step, done, again, latency)
    kinds = set()
    for i, r in enumerate(rings):
        s = state_of(float(p[i]), r, float(period[i]), latency)
        kinds.add((s.phase, r.coarse))
        assert (int(phase[i]), float(remaining[i]), int(step[i]), int(done[i])) == (s.phase, s.remaining, s.step,
                                                                                    s.done), r
        expected = s.done + min(elapsed_of(s, r, float(again[i]), latency) / float(again[i]), ALMOST_ONE)
        assert float(p0[i]) == expected
    assert {(0, False), (0, True), (1, False), (1, True), (2, False)} <= kinds  # every branch was taken


def mean_field_by_ring(rings: list[Ring], capacity: list[float], latency: float) -> dict[int, float]:
    """The fixed point as a ring-by-ring loop (the mean field's definition, no arrays), from zero duty cycles."""
    duty = {r.key: 0.0 for r in rings}
    period = {r.key: r.compute_s for r in rings}
    talking = [r for r in rings if r.steps]
    for _ in range(ROUNDS):
        load: dict[int, float] = {}
        for r in talking:
            for link, w in r.links.items():
                load[link] = load.get(link, 0.0) + w * duty[r.key]
        new, transfer = {}, {}
        for r in talking:
            per_byte = 1.0 / r.cap
            for link, w in r.links.items():
                per_byte = max(per_byte, (w + load[link] - w * duty[r.key]) * (1.0 / capacity[link]))
            transfer[r.key] = r.steps * r.step_bytes * per_byte
            new[r.key] = r.compute_s + transfer[r.key] + r.steps * latency
        worst = max(abs(new[k] - period[k]) / new[k] for k in new)
        period.update(new)
        duty.update({k: 0.5 * duty[k] + 0.5 * transfer[k] / new[k] for k in new})
        if worst < TOLERANCE:
            break
    return period


def test_the_mean_field_over_arrays_equals_a_ring_by_ring_loop():
    rng = random.Random(11)
    rings = random_rings(rng, 300, 12)
    capacity = [rng.uniform(20, 200) * MB for _ in range(12)]
    periods, _ = mean_field(rings, capacity, 2e-5)
    assert periods == mean_field_by_ring(rings, capacity, 2e-5)


def _run(rack, jobs, policy: str, options: Options, vector_min: int, monkeypatch) -> tuple[list, list, dict, int]:
    blocks = []
    solve_block = Interference._solve_block

    def counted(self, t, keys, pending):
        blocks.append(len(keys))
        return solve_block(self, t, keys, pending)

    monkeypatch.setattr(Interference, "VECTOR_MIN", vector_min)
    monkeypatch.setattr(Interference, "_solve_block", counted)
    out = Run(rack, jobs, policies(300.0)[policy], options).run()
    return [dataclasses.asdict(j) for j in out.jobs], list(out.busy), out.stats, len(blocks)


@pytest.mark.parametrize("sharing", ["maxmin", "held"])
def test_a_run_with_large_components_as_arrays_equals_the_per_ring_path(sharing, monkeypatch):
    rack = racks.generate(racks.RackOptions(256, gpus_per_switch=8, gpus_per_server=4, oversubscription=8,
                                            models=(("V100", 0.5), ("A100", 0.5)), spare=2.0))
    jobs = workloads.synthetic(800, 3, len(rack.gpus), {m: _typical_iteration(rack, m) for m in WORKLOADS}, 0.9)
    # components of more than 3 rings go to the mean field; those of 5 or more are solved as arrays, the others
    # ring by ring, so rings pass between the two paths as their component grows and shrinks
    options = Options(NetParams(sharing=sharing), Limits(rings=3))
    jobs_a, busy_a, stats_a, blocks_a = _run(rack, jobs, "fixed", options, 5, monkeypatch)
    jobs_r, busy_r, stats_r, blocks_r = _run(rack, jobs, "fixed", options, 10**9, monkeypatch)
    assert blocks_r == 0 and blocks_a >= 10  # the arrays were used, and only where asked
    assert stats_a["mean"] > blocks_a  # and so was the per-ring mean field
    assert jobs_a == jobs_r
    assert busy_a == busy_r
    assert stats_a == stats_r


def test_a_ring_stored_as_columns_comes_back_as_the_per_ring_state():
    cols = Columns()
    cols.set_ring(Ring(7, 0.1, 0.1, 4, 100 * MB, 10 * MB, {0: 1}), 50)
    cols.put(7, RingState(2, 1.5e-5, 3, 12), 12.75)
    state, progress = cols.get(7)
    assert (state.phase, state.remaining, state.step, state.done, progress) == (2, 1.5e-5, 3, 12, 12.75)
    assert all(isinstance(x, int) for x in (state.phase, state.step, state.done))


def _interference_of(rings, links: int) -> Interference:
    """An Interference over `links` links of capacity 1 holding `rings`, each ring's columns set."""
    inter = Interference([1.0] * links, 0.0)
    for r in rings:
        inter.rings[r.key] = r
        for link in r.links:
            inter.users.setdefault(link, set()).add(r.key)
        inter.cols.set_ring(r, 1)
    return inter


def test_parts_as_arrays_are_the_components_a_search_finds():
    rng = random.Random(3)
    for _ in range(20):
        rings = [r for r in random_rings(rng, 60, 150) if r.links]
        inter = _interference_of(rings, 150)
        keys = [r.key for r in rings]
        found, rest = [], set(keys)
        while rest:
            group = inter._connected(next(iter(rest)), rest)
            rest -= group
            found.append(sorted(group))
        parts = inter.cols.parts(keys)
        assert sorted(sorted(p) for p in parts) == sorted(found)
        assert len(found) > 1 and any(len(g) > 2 for g in found)  # several parts, not all single rings


def test_a_component_shown_joined_after_rings_leave_is_one_part():
    """`Interference._joined`: where the rings on the links that the rings gone crossed are joined through each other,
    what is left of a component is one part (what `Columns.parts` finds); it says so often, and never wrongly."""
    rng = random.Random(8)
    said = split = 0
    for _ in range(300):
        rings = [r for r in random_rings(rng, 40, 30) if r.links]
        inter = _interference_of(rings, 30)
        whole = max(inter.cols.parts([r.key for r in rings]), key=len)  # one component
        gone = rng.sample(whole, rng.randint(1, 3))
        for k in gone:
            for link in inter.rings[k].links:
                inter.users[link].discard(k)
        rest = [k for k in whole if k not in gone]
        joined = inter._joined([link for k in gone for link in inter.rings[k].links])
        parts = len(inter.cols.parts(rest)) if rest else 1
        assert parts == 1 or not joined
        said += joined
        split += parts > 1
    assert said > 40 and split > 10  # both cases met (seeded: 51 said joined)


def test_a_run_that_skips_the_search_for_parts_where_shown_joined_equals_one_that_searches(monkeypatch):
    rack = racks.generate(racks.RackOptions(256, gpus_per_switch=8, gpus_per_server=4, oversubscription=8,
                                            models=(("V100", 0.5), ("A100", 0.5)), spare=2.0))
    jobs = workloads.synthetic(800, 3, len(rack.gpus), {m: _typical_iteration(rack, m) for m in WORKLOADS}, 0.9)
    options = Options(NetParams(), Limits(rings=3))
    shown = []
    joined = Interference._joined
    monkeypatch.setattr(Interference, "_joined", lambda self, cut: shown.append(joined(self, cut)) or shown[-1])
    jobs_a, busy_a, stats_a, blocks_a = _run(rack, jobs, "fixed", options, 5, monkeypatch)
    assert sum(shown) >= 5  # of 14 searches (deterministic: seeded)
    monkeypatch.setattr(Interference, "_joined", lambda self, cut: False)  # every one searched
    jobs_s, busy_s, stats_s, blocks_s = _run(rack, jobs, "fixed", options, 5, monkeypatch)
    assert (jobs_a, busy_a, stats_a, blocks_a) == (jobs_s, busy_s, stats_s, blocks_s)

"""What the simulator's speed and memory work must not change: the policies' runs in worker processes equal the same
runs in one process, a worker's failure is an error in the parent, a run's rows kept as typed arrays read as the
tuples they were, and the detail loop with its arithmetic inlined steps exactly as the general one."""
import dataclasses
import json
import os
import pickle
import random
import re
import time

import pytest

from simulator.cli.main import _typical_iteration
from simulator.inputs import racks, workloads
from simulator.model import neighbours
from simulator.model.busy import Rows
from simulator.model.detail import Detail, RingState
from simulator.model.engine import Options, policies
from simulator.model.maxmin import max_min
from simulator.model.models import WORKLOADS
from simulator.model.results import JobResult
from simulator.model.rings import Ring
from simulator.studies import study

RACK = racks.RackOptions(64, gpus_per_switch=8, gpus_per_server=4, oversubscription=4, models=(("V100", 1.0),))


def _study(workers: int):
    rack = racks.generate(RACK)
    jobs = workloads.synthetic(60, 5, len(rack.gpus), {m: _typical_iteration(rack, m) for m in WORKLOADS}, 0.9)
    chosen = list(policies(300.0).values())[:4]
    return study.run_all(rack, jobs, chosen, Options(), quiet=True, workers=workers)


def _plain(run):
    return [dataclasses.asdict(j) for j in run.jobs], list(run.held), list(run.busy), list(run.frag), run.stats


def test_runs_in_worker_processes_equal_the_same_runs_in_one_process(monkeypatch, tmp_path):
    one = _study(1)
    parent, real = os.getpid(), neighbours.run_class

    def run_class(policy):  # the parent waits a little first: the worker surely takes a run
        with open(tmp_path / "pids", "a") as f:
            f.write(f"{os.getpid()}\n")
        if os.getpid() == parent:
            time.sleep(0.2)
        return real(policy)

    monkeypatch.setattr(neighbours, "run_class", run_class)
    two = _study(2)
    pids = (tmp_path / "pids").read_text().split()
    assert len(pids) == 4 and len(set(pids)) == 2 and str(parent) in pids
    assert list(one.runs) == list(two.runs) and len(one.runs) == 4
    for name in one.runs:
        assert _plain(one.runs[name]) == _plain(two.runs[name])
        assert len(one.runs[name].held) > 0 and len(one.runs[name].frag) > 0


def test_the_figures_of_each_run_are_made_once_while_idle_and_are_build_s(monkeypatch, tmp_path):
    """run_all's `figures`: made once per run, in the parent, equal to what report.build makes without them (the same
    record); the worker takes the first policy, and the parent, done first, makes its own runs' figures while the
    worker still runs."""
    from simulator.cli import report

    parent, real = os.getpid(), neighbours.run_class
    log = tmp_path / "log"

    def run_class(policy):
        with open(log, "a") as f:
            f.write(f"run {policy.name} {os.getpid() == parent}\n")
        if os.getpid() != parent:
            time.sleep(0.5)  # the worker's runs end last
        return real(policy)

    def figures(study_, name):
        assert os.getpid() == parent and name in study_.runs
        with open(log, "a") as f:
            f.write(f"figures {name} {sorted(study_.runs)}\n")
        return report.run_figures(study_, name)

    monkeypatch.setattr(neighbours, "run_class", run_class)
    rack = racks.generate(RACK)
    jobs = workloads.synthetic(60, 5, len(rack.gpus), {m: _typical_iteration(rack, m) for m in WORKLOADS}, 0.9)
    chosen = list(policies(300.0).values())[:4]
    two = study.run_all(rack, jobs, chosen, Options(), quiet=True, workers=2, figures=figures)
    lines = log.read_text().splitlines()
    first = chosen[0].name
    assert f"run {first} False" in lines  # the worker took the first policy
    made = [line.split()[1] for line in lines if line.startswith("figures")]
    assert sorted(made) == sorted(two.runs) and list(two.figures) == list(two.runs)
    mine = [line.split()[1] for line in lines if line.endswith(" True") and line.startswith("run")]
    assert mine and all(len(line.split("[")[1].split(",")) < 4 for line in lines
                        if line.startswith("figures") and line.split()[1] in mine)  # before the last run came
    meta = {"command": "test"}
    assert json.dumps(report.build(two, meta), sort_keys=True) == \
        json.dumps(report.build(dataclasses.replace(two, figures={}), meta), sort_keys=True)


def test_a_job_s_result_pickled_comes_back_field_for_field():
    """JobResult's own pickling (its fields' values in order, made again by its constructor, as a worker's runs come
    back): every field of random results, each set to a value of its own, equal after every protocol, floats to the
    bit, types kept."""
    rng = random.Random(3)
    names = [f.name for f in dataclasses.fields(JobResult)]

    def value(f):
        if f.name == "placement":
            return tuple(f"gpu{rng.randrange(99)}" for _ in range(rng.randrange(1, 5)))
        kind = {"float": float, "int": int, "str": str, "bool": bool}[str(f.type).split(" ")[0]]
        return {float: rng.uniform(-1e6, 1e6), int: rng.randrange(-9, 10**9), str: f"s{rng.random()}",
                bool: rng.random() < 0.5}[kind]

    for _ in range(20):
        job = JobResult(**{f.name: value(f) for f in dataclasses.fields(JobResult)})
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps([job, job], protocol))
            assert back[0] is back[1]
            for name in names:
                a, b = getattr(job, name), getattr(back[0], name)
                assert type(a) is type(b) and (a.hex() == b.hex() if isinstance(a, float) else a == b), name
    assert JobResult.__reduce__(job) == (JobResult, tuple(getattr(job, n) for n in names))


def test_a_run_that_fails_in_a_worker_is_an_error_in_the_parent_naming_it(monkeypatch):
    class Broken:
        def __init__(self, *args):
            pass

        def run(self):
            raise ValueError("the broken run")

    parent, real = os.getpid(), neighbours.run_class
    # the parent runs policies too: only the forked worker's runs break
    monkeypatch.setattr(neighbours, "run_class", lambda policy: real(policy) if os.getpid() == parent else Broken)
    with pytest.raises(RuntimeError, match="failed in its worker process(.|\n)*the broken run"):
        _study(2)


def test_rows_read_back_as_the_tuples_appended_integers_as_integers():
    rows = Rows("dqq")
    assert not rows and list(rows) == []
    for row in [(0.5, 3, 7), (1e-300, -2, 2**40), (2.0, 0, 0)]:
        rows.append(row)
    back = list(rows)
    assert back == [(0.5, 3, 7), (1e-300, -2, 2**40), (2.0, 0, 0)] and len(rows) == 3
    assert [type(v) for v in back[2]] == [float, int, int]
    with pytest.raises(TypeError):
        rows.append((1.0, 2.5, 3))  # an integer column refuses a float


def test_the_lean_detail_loop_steps_as_the_general_one_bit_for_bit():
    class General(Detail):  # a subclass takes the general loop
        pass

    rnd = random.Random(7)
    for trial in range(30):
        rings = []
        for key in range(rnd.randint(2, 6)):
            links = {link: rnd.randint(1, 3) for link in rnd.sample(range(5), rnd.randint(1, 3))}
            rings.append(Ring(key, rnd.uniform(0.01, 0.2), 0.0, 8, rnd.uniform(1e6, 5e8), rnd.uniform(5e9, 2e10),
                              links, rnd.random() < 0.5, rnd.choice([None, 1e-5])))
        capacity = [rnd.uniform(5e9, 3e10) for _ in range(5)]
        held = trial % 3 == 0
        states = {r.key: RingState(remaining=r.compute_s * rnd.random()) for r in rings}
        a = Detail(rings, capacity, 2e-6, {k: s.copy() for k, s in states.items()}, held)
        b = General(rings, capacity, 2e-6, {k: s.copy() for k, s in states.items()}, held)
        targets = {r.key: rnd.randint(3, 40) for r in rings}
        window = {r.key: rnd.randint(2, 20) for r in rings} if trial % 2 else None
        until = rnd.choice([float("inf"), rnd.uniform(0.05, 2.0)])
        most = rnd.choice([50, 10**6])
        out_a = a.run(0.0, until, targets=targets, window=window, max_events=most)
        out_b = b.run(0.0, until, targets=targets, window=window, max_events=most)
        assert out_a == out_b
        assert a.states == b.states  # every float the same, every iteration's end


def test_the_lean_detail_loop_steps_as_the_general_one_with_rings_of_one_to_three_gpus():
    class General(Detail):
        pass

    rnd = random.Random(11)
    for trial in range(30):
        rings = [Ring(key, rnd.uniform(0.01, 0.2), 0.0, rnd.choice([1, 2, 3]), rnd.uniform(1e6, 5e8),
                      rnd.uniform(5e9, 2e10), {link: rnd.randint(1, 2) for link in rnd.sample(range(4), 2)},
                      rnd.random() < 0.5, rnd.choice([None, 0.0, 1e-5])) for key in range(rnd.randint(1, 7))]
        capacity = [rnd.uniform(5e9, 3e10) for _ in range(4)]
        states = {r.key: RingState(remaining=r.compute_s * rnd.random()) for r in rings}
        a, b = (cls(rings, capacity, 2e-6, {k: s.copy() for k, s in states.items()}, trial % 4 == 0)
                for cls in (Detail, General))
        targets = {r.key: rnd.randint(2, 30) for r in rings}
        until = rnd.choice([float("inf"), rnd.uniform(0.05, 2.0)])
        assert a.run(0.0, until, targets=targets) == b.run(0.0, until, targets=targets)
        assert a.states == b.states


def _max_min_plain(caps, uses, capacity):
    """Progressive filling written plainly: every link's share computed afresh in every round."""
    rates, remaining, users, weight = {}, {}, {}, {}
    for j, links in uses.items():
        for link, w in links.items():
            remaining.setdefault(link, capacity[link])
            users.setdefault(link, set()).add(j)
            weight[link] = weight.get(link, 0) + (w if j in caps else 0)
    active = set(caps)
    while active:
        level, tight = min([caps[j] for j in active]), None
        for link, w in weight.items():
            if w and remaining[link] / w < level:
                level, tight = remaining[link] / w, link
        frozen = {j for j in active if caps[j] <= level} if tight is None else {j for j in users[tight] if j in active}
        for j in frozen:
            rates[j] = level
            for link, w in uses.get(j, {}).items():
                remaining[link] = max(0.0, remaining[link] - w * level)
                weight[link] -= w
        active -= frozen
    return rates


def test_max_min_gives_the_plain_progressive_fillings_floats_in_its_order():
    rnd = random.Random(3)
    for _ in range(1500):
        keys = rnd.sample(range(100_000), rnd.randint(2, 9))
        nlinks = rnd.randint(1, 12)
        caps = {k: rnd.choice([rnd.uniform(1e9, 3e10), 1.25e10]) for k in keys}
        uses = {k: {link: rnd.randint(1, 3) for link in rnd.sample(range(nlinks), rnd.randint(1, nlinks))}
                for k in keys}
        for k in rnd.sample(keys, rnd.randint(0, len(keys) - 1)) if rnd.random() < 0.3 else ():
            del caps[k]  # rings on the links that take no share
        capacity = [rnd.choice([rnd.uniform(1e9, 3e10), 2.5e10, 1.25e10]) for _ in range(nlinks)]
        got, want = max_min(caps, uses, capacity), _max_min_plain(caps, uses, capacity)
        assert list(got.items()) == list(want.items())


def _sharing_sets(rnd, equal_caps: bool):
    """Random rings on a few links (some sharing none with the others), and each ring's cap."""
    keys = rnd.sample(range(100_000), rnd.randint(2, 10))
    nlinks = rnd.randint(2, 16)
    capacity = [rnd.choice([rnd.uniform(1e9, 3e10), 2.5e10, 1.25e10]) for _ in range(nlinks)]
    rings = {}
    for k in keys:
        links = {link: rnd.randint(1, 3) for link in rnd.sample(range(nlinks), rnd.randint(0, min(3, nlinks)))}
        cap = 1.25e10 if equal_caps else rnd.choice([rnd.uniform(1e9, 3e10), 1.25e10])
        rings[k] = Ring(k, 0.01, 0.01, 4, 1e6, cap, links, coarse=True)
    return rings, capacity


def test_rates_solved_part_by_part_are_the_whole_solves_floats(monkeypatch):
    """Rings of one cap that share no link with another part get, solved part by part, the floats max_min gives them
    solved all together; a part met again in another set is not solved again; with caps that differ the set is solved
    whole."""
    import simulator.model.detail as detail_module

    rnd = random.Random(11)
    calls = []
    monkeypatch.setattr(detail_module, "max_min", lambda caps, *a: calls.append(tuple(caps)) or max_min(caps, *a))
    split = whole = 0
    for trial in range(600):
        rings, capacity = _sharing_sets(rnd, trial % 3 != 0)
        equal = len({r.cap for r in rings.values()}) == 1  # drawn alike or not
        d = Detail(list(rings.values()), capacity, 1e-6)
        keys = tuple(d.states)
        calls.clear()
        got = d._solved(keys)
        want = max_min({k: rings[k].cap for k in keys}, {k: rings[k].links for k in keys}, capacity)
        assert {k: v.hex() for k, v in got.items()} == {k: v.hex() for k, v in want.items()}
        parts = detail_module._parts(keys, rings)
        assert sorted(k for p in parts for k in p) == sorted(keys)
        assert all(not set(rings[a].links) & set(rings[b].links) for p in parts for q in parts if p != q
                   for a in p for b in q)
        if equal and len(parts) > 1:
            split += 1
            assert calls == list(parts)  # each part solved on its own
            calls.clear()
            for p in parts:  # met again, alone: no solve
                assert d._solved(p) == {k: got[k] for k in p}
            assert calls == []
        else:
            whole += not equal
            assert calls == [keys]
    assert split > 100 and whole > 100  # both paths exercised


def test_the_mask_solver_gives_rates_of_its_rates_with_the_same_solves(monkeypatch):
    """The lean loop's solver by mask (`Detail._mask_solver`) gives what `_rates_of` gives for every mask (every float,
    in the same order), solving the same rings in the same order (each part once), and keeps the same rates by the
    same tags."""
    import simulator.model.detail as detail_module

    rnd = random.Random(5)
    calls = []
    monkeypatch.setattr(detail_module, "max_min", lambda caps, *a: calls.append(tuple(caps)) or max_min(caps, *a))
    split = 0
    for trial in range(300):
        rings, capacity = _sharing_sets(rnd, trial % 3 != 0)
        a, b = (Detail(list(rings.values()), capacity, 1e-6) for _ in range(2))
        rows = [(k, None, 1 << i) for i, k in enumerate(a.states)]  # a row's key first, its bit last
        solve = a._mask_solver(rows)
        masks = [rnd.randint(1, (1 << len(rows)) - 1) for _ in range(12)]
        for mask in masks + masks[:4]:  # some met again
            calls.clear()
            got = solve(mask)
            mine = list(calls)
            calls.clear()
            want = b._rates_of(rows, mask)
            assert [(k, v.hex()) for k, v in got.items()] == [(k, v.hex()) for k, v in want.items()]
            assert mine == calls
            split += len(mine) > 1
        assert {t: list(r.items()) for t, r in a._known.items()} == {t: list(r.items()) for t, r in b._known.items()}
    assert split > 50  # sets solved part by part exercised


def _hexed(states):
    return {k: (s.phase, s.remaining.hex(), s.step, s.done, [t.hex() for t in s.ends]) for k, s in states.items()}


def test_the_coarse_loop_steps_as_the_lean_one_bit_for_bit():
    """Every ring coarse (the cluster scale): `Detail.run` takes `_run_coarse`, which gives `_run_lean`'s outcome,
    rates kept and states, every float the same (their hex), held or not, stopped by a target, a window, `until` or the
    events' bound."""
    rnd = random.Random(13)
    taken = 0
    for trial in range(200):
        rings = []
        for key in rnd.sample(range(1000), rnd.randint(1, 9)):
            links = {link: rnd.randint(1, 3) for link in rnd.sample(range(6), rnd.randint(0, 3))}
            rings.append(Ring(key, rnd.uniform(0.01, 0.2), 0.0, rnd.choice([1, 2, 4, 8]), rnd.uniform(1e6, 5e8),
                              rnd.choice([1.25e10, rnd.uniform(5e9, 2e10)]), links, True, rnd.choice([None, 1e-5])))
        capacity = [rnd.uniform(5e9, 3e10) for _ in range(6)]
        held = trial % 4 == 0
        states = {}
        for r in rings:
            if r.steps and rnd.random() < 0.4:
                states[r.key] = RingState(1, rnd.uniform(0.01, float(r.steps)), 0, rnd.randint(0, 3))
            else:
                states[r.key] = RingState(remaining=r.compute_s * rnd.random(), done=rnd.randint(0, 3))
        a, b = (Detail(rings, capacity, 2e-6, {k: s.copy() for k, s in states.items()}, held) for _ in range(2))
        targets = {r.key: rnd.randint(4, 40) for r in rings if rnd.random() < 0.8}
        window = {r.key: rnd.randint(4, 20) for r in rings} if trial % 2 else None
        until = rnd.choice([float("inf"), rnd.uniform(0.05, 2.0)])
        most = rnd.choice([7, 10**6])
        calls = []
        a._run_coarse = lambda *args, real=a._run_coarse, calls=calls: calls.append(1) or real(*args)
        out_a = a.run(0.0, until, targets=targets, window=window, max_events=most)
        out_b = b._run_lean(0.0, until, targets, most, window)
        assert calls == [1]
        assert (out_a.t.hex(), out_a.finished, out_a.events) == (out_b.t.hex(), out_b.finished, out_b.events)
        assert _hexed(a.states) == _hexed(b.states)
        assert {k: v.hex() for k, v in a.rates.items()} == {k: v.hex() for k, v in b.rates.items()}
        taken += out_a.events > 20
    assert taken > 50


def _series_by_piece(pieces, end, bins):
    """metrics.series as a loop over the pieces (its definition)."""
    width = end / bins if end > 0 else 1.0
    out = [0.0] * bins
    for t0, t1, amount in pieces:
        if t1 <= t0:
            continue
        rate = amount / (t1 - t0)
        first, last = int(t0 / width), min(int(t1 / width), bins - 1)
        for b in range(max(first, 0), last + 1):
            overlap = min(t1, (b + 1) * width) - max(t0, b * width)
            if overlap > 0:
                out[b] += rate * overlap / width
    return out


def _within_by_piece(pieces, t0, t1):
    total = 0.0
    for a, b, amount in pieces:
        overlap = min(b, t1) - max(a, t0)
        if b > a and overlap > 0:
            total += amount * overlap / (b - a)
    return total


def test_utilization_figures_as_arrays_are_the_loops_floats():
    """metrics' series, steady window share and totals over a run's rows as arrays: every float the loops over the
    rows give (each bin and total summed in the rows' order), from Busy, Rows and lists alike."""
    from simulator.model.busy import Busy
    from simulator.studies import metrics

    rnd = random.Random(4)
    for _ in range(40):
        busy, held = Busy(), Rows("ddq")
        for _ in range(rnd.randint(0, 3000)):
            a = rnd.choice([0.0, rnd.uniform(0, 5000), float(rnd.randint(0, 100)) * 25.0])
            b = a + rnd.choice([0.0, rnd.uniform(0, 10), rnd.uniform(0, 3000), 25.0])
            busy.add(a, b, rnd.uniform(0, 1e4))
            held.append((a, b, rnd.randint(1, 64)))
        end = max([b for _, b, _ in busy], default=0.0) * rnd.choice([1.0, 0.9])
        pieces = [(a, b, n * (b - a)) for a, b, n in held]
        for rows, listed in ((busy, list(busy)), (metrics._held(_Held(held)), pieces)):
            got = metrics.series(rows, end, 200)
            assert [x.hex() for x in got] == [x.hex() for x in _series_by_piece(listed, end, 200)]
            assert metrics.series(listed, end, 200) == got
            t0, t1 = sorted(rnd.uniform(0, 5000) for _ in range(2))
            assert metrics._within(rows, t0, t1).hex() == _within_by_piece(listed, t0, t1).hex()
        assert metrics._sum(metrics._held(_Held(held))[2]).hex() == float(sum((b - a) * n for a, b, n in held)).hex()
        assert metrics._sum(metrics._columns(busy)[2]).hex() == float(sum(x for _, _, x in busy)).hex()


@dataclasses.dataclass
class _Held:
    held: object


def test_a_plan_without_its_note_is_the_same_plan_committed_alike():
    """`placement.plan(..., noted=False)` (the simulator's: it never reads the note) gives and commits the plan that
    `noted=True` gives, with no note; the same errors where none can be made."""
    from controller.core import placement
    from controller.core.circuits import CircuitMap
    from controller.core.occupancy import Occupancy

    rack = racks.generate(racks.RackOptions(256, gpus_per_switch=8, gpus_per_server=4, oversubscription=4,
                                            models=(("V100", 0.5), ("A100", 0.5)), spare=1.5))
    noted, bare = (Occupancy(rack, CircuitMap.initial(rack), {}) for _ in range(2))
    rnd = random.Random(2)
    placed = 0
    for i in range(400):
        if noted.jobs and rnd.random() < 0.4:
            job = rnd.choice(sorted(noted.jobs))
            noted.release(job)
            bare.release(job)
            continue
        req = placement.Request(rnd.choice([1, 2, 4, 8, 16, 32, 64]), rnd.choice(["fixed", "regroup"]),
                                rnd.choice([None, None, "A100"]), rnd.choice(["vgg16", "resnet50"]))
        try:
            p = placement.plan(noted, req, f"j{i}")
        except placement.PlacementError as e:
            with pytest.raises(type(e), match=re.escape(str(e))):
                placement.plan(bare, req, f"j{i}", noted=False)
            continue
        q = placement.plan(bare, req, f"j{i}", noted=False)
        assert (p.gpus, p.switches, p.remove, p.add) == (q.gpus, q.switches, q.remove, q.add)
        assert p.note and not q.note
        assert (noted.holder, noted.partner, noted.jobs) == (bare.holder, bare.partner, bare.jobs)
        placed += 1
    assert placed > 150

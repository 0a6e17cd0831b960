"""The simulator's flow model against closed forms: max-min rates, a lone ring, rings sharing a link."""
import pytest

from simulator.model.detail import Detail
from simulator.model.interference import Interference
from simulator.model.maxmin import max_min
from simulator.model.rings import Ring, alone_rate, iteration_time

MB = 1e6


def ring(key, n=4, compute=0.2, size=100 * MB, cap=100.0 * MB, links=None):
    return Ring(key, compute, compute, n, size, cap, dict(links or {}))


def test_max_min_shares_a_link_and_gives_the_rest_to_the_uncapped():
    # rings 0 and 1 share link 0 (capacity 10); ring 1 is capped at 2 by its NIC, so ring 0 gets 8
    assert max_min({0: 100, 1: 2}, {0: {0: 1}, 1: {0: 1}}, [10.0]) == {0: 8.0, 1: 2.0}
    # ring 0 has two flows on link 0: it counts twice there
    assert max_min({0: 100, 1: 100}, {0: {0: 2}, 1: {0: 1}}, [9.0]) == pytest.approx({0: 3.0, 1: 3.0})
    # ring 2 is bottlenecked on link 1, which leaves more of link 0 to ring 0
    rates = max_min({0: 100, 2: 100}, {0: {0: 1}, 2: {0: 1, 1: 1}}, [10.0, 1.0])
    assert rates == pytest.approx({0: 9.0, 2: 1.0})


def test_a_lone_ring_matches_its_closed_form():
    r = ring(0, n=4, links={0: 1})
    capacity = [50.0 * MB]
    rate = alone_rate(r, capacity)
    assert rate == 50.0 * MB  # the link, not the NIC
    expected = 0.2 + 6 * (25 * MB / rate + 0.003)
    assert iteration_time(r, rate, 0.003) == pytest.approx(expected)
    d = Detail([r], capacity, 0.003)
    out = d.run(0.0, 1e9, targets={0: 10})
    assert out.finished == [0]
    assert out.t == pytest.approx(10 * expected)
    assert d.states[0].ends[0] == pytest.approx(expected)


def test_two_aligned_rings_on_one_link_take_twice_as_long_to_communicate():
    a, b = ring(0, links={0: 1}), ring(1, links={0: 1})
    capacity = [50.0 * MB]
    out = Detail([a, b], capacity, 0.0).run(0.0, 1e9, targets={0: 5, 1: 5})
    alone_comm = 6 * 25 * MB / (50 * MB)
    assert out.t == pytest.approx(5 * (0.2 + 2 * alone_comm))
    assert sorted(out.finished) == [0, 1]  # perfectly symmetric: they end together


def test_rings_shifted_by_half_a_period_never_meet():
    # compute 0.5 s, communication 0.3 s alone: shifted by 0.4 s the two never overlap
    a, b = (ring(k, compute=0.5, cap=1e12, links={0: 1}) for k in (0, 1))
    capacity = [6 * 25 * MB / 0.3]  # 6 steps of 25 MB in 0.3 s
    d = Detail([a, b], capacity, 0.0)
    d.states[1].remaining = 0.1  # b is 0.4 s ahead in its compute phase
    d.run(0.0, 8.0)
    ends_a = d.states[0].ends
    periods = [y - x for x, y in zip(ends_a, ends_a[1:], strict=False)]
    assert periods and all(p == pytest.approx(0.8) for p in periods)


def test_a_ring_capped_by_its_nic_leaves_the_link_to_the_other():
    slow = ring(0, cap=10 * MB, links={0: 1})
    fast = ring(1, links={0: 1})
    d = Detail([slow, fast], [50.0 * MB], 0.0)
    d.run(0.0, 0.2 + 1e-9)  # both are about to transfer
    d.run(0.2 + 1e-9, 0.21)
    assert d.rates == pytest.approx({0: 10 * MB, 1: 40 * MB})


def test_the_mean_field_agrees_with_stepping_through_rings_at_random_phases():
    """What the cluster engine uses for components too large to step through, against stepping."""
    import random
    import statistics

    from simulator.model.detail import RingState
    from simulator.model.meanfield import mean_field

    rng = random.Random(5)
    errors = []
    for _ in range(30):
        capacity = [rng.choice([12.5e9, 25e9]) * 0.9 for _ in range(6)]
        rings = [Ring(k, rng.uniform(0.05, 0.2), 0.1, rng.choice([4, 8, 16]), rng.choice([102e6, 553e6]), 11.25e9,
                      {link: 1 for link in rng.sample(range(6), 2)}, True) for k in range(rng.randint(3, 8))]
        predicted, _ = mean_field(rings, capacity, 2e-5)
        d = Detail(rings, capacity, 2e-5, {r.key: RingState(remaining=rng.uniform(0, r.compute_s)) for r in rings})
        d.run(0.0, 60.0)
        for r in rings:
            tail = d.states[r.key].ends[len(d.states[r.key].ends) // 2:]
            errors.append(predicted[r.key] / ((tail[-1] - tail[0]) / (len(tail) - 1)) - 1)
    assert abs(statistics.median(errors)) < 0.03
    assert max(abs(e) for e in errors) < 0.2
    assert max(errors) > 0.02  # it does differ: phases are not independent when stepped through


def test_held_shares_leave_a_computing_rings_share_unused():
    """Sharing "held" (simulator/model/detail.py, the emulation's): shifted rings that never meet under max-min
    still each get half the link, so each all-reduce takes twice as long as alone."""
    a, b = (ring(k, compute=0.5, cap=1e12, links={0: 1}) for k in (0, 1))
    capacity = [6 * 25 * MB / 0.3]
    d = Detail([a, b], capacity, 0.0, held=True)
    d.states[1].remaining = 0.1
    d.run(0.0, 8.0)
    ends_a = d.states[0].ends
    periods = [y - x for x, y in zip(ends_a, ends_a[1:], strict=False)]
    assert periods and all(p == pytest.approx(0.5 + 2 * 0.3) for p in periods)
    # a ring alone on its links is not slowed by holding
    d = Detail([ring(0, links={0: 1})], [50.0 * MB], 0.0, held=True)
    assert d.run(0.0, 1e9, targets={0: 2}).t == pytest.approx(2 * (0.2 + 6 * 25 * MB / (50 * MB)))


@pytest.mark.parametrize("held", [True, False])
def test_a_component_too_large_to_step_through_takes_held_shares_too(held):
    """Held shares in the mean-field path: the component's closed form (each ring's max-min rate among all
    placed on its links) is what stepping through gives; under max-min the two paths differ."""
    rings = [ring(0, compute=0.3, links={0: 1}), ring(1, compute=0.1, links={0: 1, 1: 2}),
             ring(2, compute=0.5, cap=10.0 * MB, links={1: 1})]
    capacity = [40.0 * MB, 30.0 * MB]
    periods = {}
    for force in ("detail", "mean"):
        inter = Interference(capacity, 0.002, force=force, held=held)
        for r in rings:
            inter.add(0.0, r, 10_000)
        assert inter.mode(0) == force
        periods[force] = {r.key: inter.period(r.key) for r in rings}
    if held:
        # link 1: ring 2 capped at 10 MB/s, ring 1's two flows share the other 20: 10 each; ring 0 the rest of link 0
        rates = {0: 30.0 * MB, 1: 10.0 * MB, 2: 10.0 * MB}
        for r in rings:
            closed = iteration_time(r, rates[r.key], 0.002)
            assert periods["mean"][r.key] == pytest.approx(closed, rel=1e-9)
            assert periods["detail"][r.key] == pytest.approx(closed, rel=1e-6)
    else:  # max-min hands idle capacity over, and the mean field only estimates how much
        assert periods["mean"] != pytest.approx(periods["detail"], rel=1e-6)


def test_rates_met_again_are_reused_and_change_nothing():
    """Stepping through reuses the max-min rates of a set of transferring rings it met before (in this run, or one
    sharing `known`); the ends are those of computing them every time."""
    import simulator.model.detail as detail

    rings = [ring(k, n=4, compute=0.1 + 0.03 * k, links={0: 1, 1 + k % 2: 1}) for k in range(4)]
    capacity = [60.0 * MB, 40.0 * MB, 45.0 * MB]
    calls = []
    plain = detail.max_min

    def counted(*a):
        calls.append(1)
        return plain(*a)

    def ends(known=None):
        d = Detail(rings, capacity, 0.002, known=known)
        d.run(0.0, 200.0)
        return {k: list(s.ends) for k, s in d.states.items()}

    mp = pytest.MonkeyPatch()
    mp.setattr(detail, "max_min", counted)
    try:
        fresh = ends()
        first = len(calls)
        known = ({}, {r.key: 100 + r.key for r in rings})
        assert ends(known) == fresh and ends(known) == fresh
    finally:
        mp.undo()
    assert 0 < first <= 2 ** len(rings)  # one solve per set of transferring rings met, not per event
    assert len(calls) == 2 * first  # the second run over `known` solved nothing again
    assert all(len(e) > 10 for e in fresh.values())

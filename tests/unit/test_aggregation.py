"""In-network aggregation on loopback: the aggregator (containers/aggregator.py) in a thread, each rank's client
(containers/aggclient.py) in its own thread, real UDP sockets; loss and duplicates injected by the drop hooks."""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from containers import aggproto as P
from containers.aggclient import AggClient, Refused, round_trips
from containers.aggregator import Aggregator

RTO = 0.01  # short timers: a lost chunk is sent again after 10 ms


@pytest.fixture
def aggregator():
    made: list[tuple[Aggregator, threading.Thread]] = []

    def start(**kw) -> Aggregator:
        agg = Aggregator("127.0.0.1", 0, **kw)
        t = threading.Thread(target=agg.serve, daemon=True)
        t.start()
        made.append((agg, t))
        return agg

    yield start
    for agg, t in made:
        agg.close()
        t.join(5)


def gradients(job: int, world: int, size: int, ops: int) -> list[list[np.ndarray]]:
    """Integer-valued float32 arrays, different per job, rank and collective (their sums are exact)."""
    rng = np.random.default_rng(job)
    return [[rng.integers(-10_000, 10_000, size).astype(np.float32) for _ in range(ops)] for _ in range(world)]


def run_job(agg: Aggregator, job: int, grads: list[list[np.ndarray]], start: threading.Barrier | None = None,
            client=AggClient, **kw) -> list[list[np.ndarray]]:
    """Every rank of a job in its own thread, each summing its arrays in turn; returns what each rank got."""
    world = len(grads)
    out: list[list[np.ndarray]] = [[] for _ in range(world)]
    errors: list[BaseException] = []
    clients = [client(agg.address, job, r, world, rto=RTO, timeout=20, **kw) for r in range(world)]

    def rank(r: int) -> None:
        try:
            clients[r].join()
            if start is not None:
                start.wait(10)
            for g in grads[r]:
                a = g.copy()
                clients[r].all_reduce(a)
                out[r].append(a)
            clients[r].leave()
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for c in clients:
            c.close()
    assert not errors, errors
    run_job.clients = clients  # type: ignore[attr-defined]
    return out


def expected(grads: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [np.sum([g[i].astype(np.float64) for g in grads], axis=0).astype(np.float32) for i in range(len(grads[0]))]


def test_sums_stream_through_a_pool_smaller_than_the_gradient(aggregator):
    agg = aggregator()
    slots, chunk, size = 4, 64, 64 * 37 + 11  # 38 chunks (the last one short) through 4 slots
    assert slots * chunk < size
    grads = gradients(1, 4, size, 3)
    grads = [g[:2] + [g[2][:100]] for g in grads]  # a third, smaller collective: fewer chunks than slots
    out = run_job(agg, 1, grads, slots=slots, chunk=chunk)
    want = expected(grads)
    for r in range(4):
        for got, w in zip(out[r], want, strict=True):
            assert np.array_equal(got, w)
    assert agg.stats["summed"] == 2 * 38 + 2 and agg.stats["stray"] == 0
    assert agg.pools == {}  # every rank left: the job's slots are free
    for c in run_job.clients:  # type: ignore[attr-defined]
        # each chunk's round trip, from its send to its sum, kept for the chunks sent once only (Karn's rule: a
        # resent chunk's is ambiguous); none is lost on loopback, but a busy host may outlast the 10 ms timer
        assert c.stats["received"] == 2 * 38 + 2
        assert c.stats["received"] - c.stats["resent"] <= len(c.rtts) <= c.stats["received"] and min(c.rtts) > 0
        trips = round_trips(c.rtts)
        assert trips["count"] == len(c.rtts) and 0 < trips["p10_ms"] <= trips["median_ms"] <= trips["p90_ms"]
    assert round_trips([]) == {"count": 0}


def test_a_chunks_timer_follows_the_round_trips_never_under_the_rto_given():
    c = AggClient(("127.0.0.1", 9), 1, 0, 2, rto=0.05)
    try:
        assert c.timer() == 1.0  # no round trip yet: the first second (RFC 6298), over the 50 ms given
        for _ in range(3):
            c.sample(0.002)  # loopback: the given rto stays
        assert c.timer() == 0.05 and c.rtts == [0.002] * 3
        for _ in range(20):
            c.sample(0.080)  # sums back after 80 ms (a loaded uplink): the timer beyond them
        assert 0.080 < c.timer() < 0.2 and c.srtt == pytest.approx(0.080, rel=0.1)
        base = c.timer()
        assert c.chunk_timer() == base
        c.timed_out(1)  # a timer ran out: the next chunks' timers double, and again, up to 32 times
        assert c.chunk_timer() == 2 * base
        c.timed_out(3)
        c.timed_out(2)
        assert c.chunk_timer() == 8 * base
        c.timed_out(9)
        assert c.chunk_timer() == 32 * base
        c.sample(0.080)  # a chunk sent once came back: the backoff ends
        assert c.chunk_timer() == c.timer()
    finally:
        c.close()
    assert round_trips([0.002, 0.001, 0.004, 0.003]) == {"count": 4, "p10_ms": 1.0, "median_ms": 3.0, "p90_ms": 4.0}


def test_two_jobs_on_one_aggregator_get_only_their_own_sums(aggregator):
    """Both jobs use the same slots with the same chunk keys at the same time: mixed slots would give wrong sums."""
    agg = aggregator()
    start = threading.Barrier(6)
    grads = {7: gradients(7, 3, 2000, 4), 8: gradients(8, 3, 2000, 4)}
    out: dict[int, list] = {}
    threads = [threading.Thread(target=lambda j=j: out.__setitem__(j, run_job(agg, j, grads[j], start, slots=2,
                                                                               chunk=50))) for j in grads]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for job, g in grads.items():
        for r in range(3):
            got = zip(out[job][r], expected(g), strict=True)
            assert all(np.array_equal(a, b) for a, b in got), f"job {job} rank {r}"
    assert agg.stats["summed"] == 2 * 4 * 40


def test_lost_and_duplicated_datagrams_still_give_the_right_sums(aggregator):
    seen = {"in": 0, "out": 0}
    lock = threading.Lock()

    def lossy(direction: str, data: bytes) -> bool:  # every 7th datagram in, every 5th out
        with lock:
            seen[direction] += 1
            return seen[direction] % (7 if direction == "in" else 5) == 0

    class Twice(AggClient):  # every datagram a rank sends arrives twice
        def _send(self, parts):
            super()._send(parts)
            super()._send(parts)

    agg = aggregator(drop=lossy)
    grads = gradients(3, 3, 3000, 3)
    out = run_job(agg, 3, grads, client=Twice, slots=8, chunk=100)
    for r in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(out[r], expected(grads), strict=True))
    assert agg.stats["dropped"] > 20 and agg.stats["duplicate"] > 50 and agg.stats["resent"] > 0
    assert sum(c.stats["resent"] for c in run_job.clients) > 0  # type: ignore[attr-defined]
    # Karn's rule: a resent chunk's round trip is not sampled (its sum may answer either send)
    resending = [c for c in run_job.clients if c.stats["resent"]]  # type: ignore[attr-defined]
    assert resending and all(len(c.rtts) <= c.stats["received"] - 1 for c in resending)


def test_a_job_that_does_not_fit_is_refused_with_the_reason(aggregator):
    agg = aggregator(jobs=1, capacity_bytes=8 * 100 * 4)
    first = AggClient(agg.address, 1, 0, 2, slots=8, chunk=100, rto=RTO, timeout=5)
    clients = [first]
    try:
        first.join()
        with pytest.raises(Refused, match="already here with world, slots, chunk"):
            c = AggClient(agg.address, 1, 1, 2, slots=4, chunk=100, rto=RTO, timeout=5)
            clients.append(c)
            c.join()
        with pytest.raises(Refused, match="holds 1 jobs, its most"):
            c = AggClient(agg.address, 2, 0, 2, slots=1, chunk=1, rto=RTO, timeout=5)
            clients.append(c)
            c.join()
        first.leave()  # the only rank that joined leaves: its job stays until its world has left
        assert list(agg.pools) == [1]
    finally:
        for c in clients:
            c.close()
    agg2 = aggregator(capacity_bytes=1000)
    c = AggClient(agg2.address, 5, 0, 1, slots=4, chunk=100, rto=RTO, timeout=5)
    try:
        with pytest.raises(Refused, match="1600 bytes of slots asked, 1000 of 1000 free"):
            c.join()
    finally:
        c.close()
    assert agg.stats["refused"] == 2 and agg2.pools == {}


def test_the_end_of_a_job_frees_its_pool_at_once_and_no_other():
    """END (the controller's word that a job is over, whoever sends it) frees that job's pool, and the room it held
    takes another job; a second END, or one for a job not there, changes nothing."""
    logged: list[dict] = []
    agg = Aggregator("127.0.0.1", 0, jobs=2, log=logged.append)
    try:
        for job in (1, 2):  # rank 0 of two jobs of 2 ranks joins from its own address
            agg.handle(P.pack(P.JOIN, job, 0, 2, 4, 0, 100), ("127.0.0.1", 40000 + job))
        agg.handle(P.pack(P.JOIN, 3, 0, 2, 4, 0, 100), ("127.0.0.1", 40003))
        assert set(agg.pools) == {1, 2} and agg.stats["refused"] == 1  # the aggregator holds 2 jobs, its most
        for _ in range(2):
            agg.handle(P.pack(P.END, 1), ("198.18.0.0", 9999))
        agg.handle(P.pack(P.END, 7), ("198.18.0.0", 9999))
        assert set(agg.pools) == {2} and agg.stats["ended"] == 3
        assert logged == [{"event": "ended", "job": 1, "freed_bytes": 1600}] + [
            {"event": "ended", "job": j, "freed_bytes": 0} for j in (1, 7)]
        agg.handle(P.pack(P.JOIN, 3, 0, 2, 4, 0, 100), ("127.0.0.1", 40003))
        assert set(agg.pools) == {2, 3}  # the room it held
    finally:
        agg.close()


def test_a_datagram_from_outside_the_job_is_never_summed(aggregator):
    agg = aggregator()
    rogue = AggClient(agg.address, 9, 0, 2, slots=2, chunk=10, rto=RTO, timeout=5)
    try:
        rogue._send([P.pack(P.DATA, 9, 0, 2, 0, 0, 0, 10), np.full(10, 1e6, np.float32).tobytes()])
        grads = gradients(9, 2, 40, 1)
        out = run_job(agg, 9, grads, slots=2, chunk=10)
        assert all(np.array_equal(out[r][0], expected(grads)[0]) for r in range(2))
    finally:
        rogue.close()


def test_bad_arguments_are_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="chunk must be 1 to"):
        AggClient(("127.0.0.1", 9), 1, 0, 2, chunk=P.MAX_CHUNK + 1)
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        AggClient(("127.0.0.1", 9), 1, 2, 2)
    c = AggClient(("127.0.0.1", 9), 1, 0, 2)
    try:
        with pytest.raises(TypeError, match="float32"):
            c.all_reduce(np.zeros(4, dtype=np.float64))
    finally:
        c.close()
    r = subprocess.run([sys.executable, "-m", "containers.aggregator", "--listen", "127.0.0.1:http"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not HOST:PORT" in r.stderr


def test_a_send_the_kernel_refuses_is_a_loss_the_timer_recovers(aggregator):
    class Refusing(AggClient):  # every 4th datagram refused by the kernel (a full queue: ENOBUFS)
        calls = 0

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            real = self.sock

            class Sock:
                def __getattr__(self, name):
                    return getattr(real, name)

                def sendmsg(self, *args):
                    Refusing.calls += 1
                    if Refusing.calls % 4 == 0:
                        raise OSError(105, "No buffer space available")
                    return real.sendmsg(*args)

            self.sock = Sock()  # type: ignore[assignment]

    agg = aggregator()
    grads = gradients(4, 2, 1000, 2)
    out = run_job(agg, 4, grads, client=Refusing, slots=4, chunk=100)
    assert all(np.array_equal(a, b) for r in range(2) for a, b in zip(out[r], expected(grads), strict=True))
    assert sum(c.stats["dropped"] for c in run_job.clients) > 0  # type: ignore[attr-defined]

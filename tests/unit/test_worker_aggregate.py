"""The worker's `--collective aggregate` on loopback: ranks as processes summing through an aggregator process (real
UDP), against the ring on torch.distributed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from containers import aggproto
from containers.aggregate import pool_shape
from containers.worker import parse_args
from tests.unit.test_worker import run_ranks


@pytest.fixture
def aggregator():
    """An aggregator process on a free loopback port; yields (address, its stats once stopped: a dict filled in)."""
    stats: dict = {}
    made: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        p = subprocess.Popen([sys.executable, "-m", "containers.aggregator", "--listen", "127.0.0.1:0", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        made.append(p)
        first = json.loads(p.stdout.readline())  # type: ignore[union-attr]
        assert first["event"] == "listening", first
        host, port = first["address"]
        return f"{host}:{port}"

    def stop() -> dict:
        for p in made:
            if p.poll() is None:
                p.terminate()
                out, _ = p.communicate(timeout=10)
                stats.update(json.loads(out.splitlines()[-1]))
        return stats

    start.stop = stop  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        stop()
        for p in made:
            if p.poll() is None:
                p.kill()
                p.wait()


def events(results: list[list[dict]], kind: str) -> list[list[dict]]:
    return [[r for r in rank if r["event"] == kind] for rank in results]


def test_profile_mode_sums_exactly_through_the_aggregator(aggregator):
    """The worker checks every iteration's sum is exactly the integer the ring gives (it exits 3 otherwise); the
    gradient (66 KB) streams through a pool of 16 slots of 256 elements (16 KB)."""
    address = aggregator()
    results = run_ranks(3, "--iterations", "3", "--gradient-bytes", "66004", "--compute-seconds", "0",
                        "--collective", "aggregate", "--aggregator", address, "--aggregation-slots", "16",
                        "--aggregation-chunk", "256")
    for rank in results:
        assert rank[0]["collective"] == "aggregate" and rank[-1]["check"] == "ok"
        assert len(events([rank], "iteration")[0]) == 3
    stats = aggregator.stop()
    assert stats["summed"] == 3 * -(-66004 // 4 // 256)  # every chunk of every iteration summed there


def test_real_mode_losses_match_the_ring(aggregator):
    args = ("--mode", "real", "--iterations", "2", "--batch", "4")  # iteration 1 is the first after a sum
    ring = run_ranks(2, *args)
    agg = run_ranks(2, *args, "--collective", "aggregate", "--aggregator", aggregator())
    for r in range(2):
        for field in ("loss", "grad_norm"):  # the averaged gradient's norm: a sum off by 1e-4 moves it, not the loss
            a, b = ([x[field] for x in events(res, "iteration")[r]] for res in (ring, agg))
            assert len(a) == len(b) == 2
            assert all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b, strict=True)), (field, a, b)
        assert agg[r][-1]["check"] == "ok"  # the replicas ended equal (the worker compares them)
    assert aggregator.stop()["summed"] > 0


def test_a_job_the_aggregator_refuses_runs_as_a_ring_and_says_so(aggregator):
    address = aggregator("--capacity-bytes", "4")
    results = run_ranks(2, "--iterations", "1", "--gradient-bytes", "4000", "--compute-seconds", "0",
                        "--collective", "aggregate", "--aggregator", address)
    for rank in results:
        assert rank[0]["collective"] == "ring" and "bytes of slots asked" in rank[0]["aggregation_refused"]
        assert rank[-1]["check"] == "ok"


def test_aggregate_needs_an_aggregator():
    r = subprocess.run([sys.executable, "-m", "containers.worker", "--rank", "0", "--world-size", "2", "--master",
                        "127.0.0.1", "--collective", "aggregate"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--collective aggregate needs --aggregator HOST:PORT" in r.stderr


def test_the_pool_fills_frames_of_the_nics_mtu_and_holds_about_64_kb_by_default():
    assert aggproto.shape_for_mtu(9000) == (7, 2236)  # 2236 x 4 + 28 + 28 header bytes: one 9000-byte frame
    assert aggproto.shape_for_mtu(1500) == (45, 361)
    base = ["--rank", "0", "--world-size", "2", "--master", "127.0.0.1", "--collective", "aggregate",
            "--aggregator", "127.0.0.1:9999"]
    assert pool_shape(parse_args([*base, "--ifname", "lo"])) == aggproto.shape_for_mtu(65536)  # loopback's MTU
    assert pool_shape(parse_args(base)) == (64, aggproto.DEFAULT_CHUNK)
    assert pool_shape(parse_args([*base, "--aggregation-chunk", "1000", "--aggregation-slots", "3"])) == (3, 1000)

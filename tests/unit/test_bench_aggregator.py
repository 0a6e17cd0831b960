"""scripts/bench_aggregator.py's pure parts: the aggregator's CPU per rank's chunk, and a process's CPU time."""
from __future__ import annotations

import time

import pytest

from scripts import bench_aggregator as b


def test_the_cost_is_the_cpu_over_every_rank_s_chunks_of_every_round():
    # 4 ranks x 62 chunks x 20 rounds = 4,960 chunks taken in
    assert b.per_chunk(0.124, 4, 62, 20) == pytest.approx(25e-6)
    with pytest.raises(ValueError, match="at least one"):
        b.per_chunk(1.0, 0, 62, 20)


def test_a_process_s_cpu_time_grows_with_its_work_not_with_its_sleep():
    import os

    pid = os.getpid()
    t0 = b.cpu_seconds(pid)
    time.sleep(0.2)
    slept = b.cpu_seconds(pid) - t0
    t1, end = b.cpu_seconds(pid), time.thread_time() + 0.1  # 0.1 s of this thread's CPU, however busy the host
    while time.thread_time() < end:
        pass
    worked = b.cpu_seconds(pid) - t1
    assert slept < 0.05 and worked == pytest.approx(0.1, abs=0.02)

"""scripts/bench_loopback.py: the loopback step the simulator's model charges, measured by a command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_measures_a_ring_on_loopback_and_records_per_step_and_per_allreduce(tmp_path):
    out = tmp_path / "lb.json"
    r = subprocess.run([sys.executable, "scripts/bench_loopback.py", "--ranks", "3", "--iterations", "4",
                        "--rounds", "2", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())["results"]
    assert res["steps"] == 4 and res["ranks"] == 3
    assert res["allreduce_ms"]["n"] == 2 and res["allreduce_ms"]["min"] > 0
    # per step is the all-reduce over its 2(N-1) steps, round by round
    for step, allreduce in zip(res["step_ms"]["values"], res["allreduce_ms"]["values"], strict=True):
        assert abs(step - allreduce / 4) < 0.002
    assert "per step (4 steps)" in r.stdout


def test_a_ring_of_one_is_refused_naming_the_option():
    r = subprocess.run([sys.executable, "scripts/bench_loopback.py", "--ranks", "1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--ranks must be at least 2" in r.stderr

"""The Lingjun 2023 trace's importer (simulator/inputs/lingjun.py) on a hand-made folder with the published columns:
three hosts under two ASWs, four jobs (one never ran, one held no GPU)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli.main import standalone
from simulator.inputs import lingjun, traces
from simulator.inputs.workloads import TraceError
from simulator.model.adapter import Placer

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "traces" / "lingjun"


def test_the_rack_puts_each_host_under_its_asw():
    rack = lingjun.rack(FIXTURE)
    assert len(rack.gpus) == 24 and len(rack.spec.servers) == 3
    where = Placer(rack).switch_of(list(rack.gpus))
    # rack order (DSW, PSW, ASW, ip): hosta, hostb under S1 (a1), hostc under S2 (a2)
    assert {where[f"g{i}"] for i in range(1, 17)} == {"a1"} and {where[f"g{i}"] for i in range(17, 25)} == {"a2"}


def test_jobs_name_the_gpus_they_ran_on():
    imported = traces.load(FIXTURE, "auto", "resnet50")
    assert imported.fmt == "lingjun"
    assert dict(imported.left_out) == {"never ran or no end": 1, "no GPU": 1}
    a, b = imported.jobs
    assert a.names == ("g1", "g2", "g3", "g4", "g17", "g18", "g19", "g20")  # 4 on hosta, 4 on hostc
    assert a.arrival_s == 0.0 and a.duration_s == 3600.0  # submitted 10:00, ran 10:01-11:01
    assert b.names == ("g5", "g6") and b.arrival_s == 300.0  # hosta's next free GPUs while a runs
    assert b.duration_s == 1800.0


def test_fixed_replays_the_placement_and_regroup_joins_it(tmp_path):
    out = tmp_path / "sim"
    assert standalone(["simulate", "--trace", str(FIXTURE), "--oversubscription", "32", "--policies",
                       "fixed,regroup", "--no-plots", "--quiet", "--workers", "1", "--out", str(out)]) == 0
    runs = json.loads((out / "results.json").read_text())["policies"]
    fixed = {j["id"]: j for j in runs["fixed"]["jobs"]}
    regroup = {j["id"]: j for j in runs["regroup"]["jobs"]}
    assert fixed["j1"]["switches"] == 2 and regroup["j1"]["switches"] == 1
    # fixed: each job alone where it ran keeps its recorded run time (within an iteration)
    assert fixed["j1"]["end_s"] - fixed["j1"]["start_s"] == pytest.approx(3600, abs=1.0)
    assert fixed["j2"]["end_s"] - fixed["j2"]["start_s"] == pytest.approx(1800, abs=1.0)
    assert regroup["j1"]["end_s"] - regroup["j1"]["start_s"] < 3600 - 60  # joined: its ring no longer crosses


def test_a_missing_column_is_named(tmp_path):
    for name in lingjun.FILES:
        (tmp_path / name).write_text((FIXTURE / name).read_text())
    (tmp_path / "worker.csv").write_text((FIXTURE / "worker.csv").read_text().replace("host_ip", "hostip"))
    with pytest.raises(TraceError, match="worker.csv: no column host_ip"):
        lingjun.load(tmp_path)
    with pytest.raises(TraceError, match="a folder of"):
        lingjun.rack(tmp_path / "absent")

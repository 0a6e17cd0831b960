"""The trace check's trace generator and its committed trace (traces/trace16.csv), and the rack it is for."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.core.rack import load_rack
from scripts import trace_gen

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_trace_is_the_generators_output_for_its_seed():
    jobs = trace_gen.generate(35, 40)
    assert (ROOT / "traces" / "trace16.csv").read_text() == trace_gen.csv_text(jobs, 35, trace_gen.LOAD)
    assert trace_gen.generate(36, 40) != jobs  # the seed decides


def test_jobs_of_1_to_8_gpus_arrive_in_order_faster_than_the_rack_runs_them():
    jobs = trace_gen.generate(35, 40)
    assert 30 <= len(jobs) <= 50 and {j["gpus"] for j in jobs} <= set(range(1, 9))
    assert [j["arrival_s"] for j in jobs] == sorted(j["arrival_s"] for j in jobs)
    work = sum(j["gpus"] * j["iterations"] * trace_gen.EST_ITERATION_S for j in jobs)
    span = jobs[-1]["arrival_s"]
    assert work / (16 * span) > 1.0  # offered load above the rack's: a queue forms


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="--jobs"):
        trace_gen.generate(1, 0)
    assert trace_gen.main(["--jobs", "0"]) == 2


def test_the_trace_rack_has_16_gpus_of_two_models_two_ocs_and_oversubscribed_uplinks():
    rack = load_rack(ROOT / "topologies" / "trace16.yaml")
    assert len(rack.gpus) == 16 and len({g.model for g in rack.gpus.values()}) == 2
    assert len(rack.ocs) == 2
    aggs = [w for w in rack.spec.switches if w.downlinks]
    assert len(aggs) == 4
    for w in aggs:
        down = sum(d.rate_gbps for d in w.downlinks)
        assert len(w.downlinks) > 4  # spare downlinks beyond the 4 GPUs a switch holds at the start
        assert down > 4 * sum(u.rate_gbps for u in w.uplinks)  # oversubscribed


@pytest.mark.parametrize("name", ["trace16.csv", "trace16-small.csv", "trace16-bursty.csv", "trace16-even.csv",
                                  "trace16-interim.csv", "trace16-after.csv", "trace16-v4a.csv", "trace16-v4b.csv"])
def test_each_committed_trace_is_remade_by_the_command_in_its_first_line(tmp_path, name):
    committed = (ROOT / "traces" / name).read_text()
    command = committed.splitlines()[0].split("python -m scripts.trace_gen ", 1)[1].split()
    assert trace_gen.main([*command, "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_text() == committed


def test_the_new_traces_differ_from_trace16_in_sizes_models_load_and_arrivals():
    def figures(name: str) -> dict:
        jobs = [line.split(",") for line in (ROOT / "traces" / name).read_text().splitlines()[4:]]
        arrivals = [float(j[0]) for j in jobs]
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
        return {"sizes": sorted({int(j[1]) for j in jobs}), "vgg16": sum(j[2] == "vgg16" for j in jobs) / len(jobs),
                "load": sum(int(j[1]) * int(j[3]) * trace_gen.EST_ITERATION_S for j in jobs) / (16 * arrivals[-1]),
                "bunched": sum(g < 2.0 for g in gaps) / len(gaps), "paired": all(g < 2.0 for g in gaps[0::2])}

    base = figures("trace16.csv")
    new = {n: figures(n) for n in ("trace16-small.csv", "trace16-bursty.csv", "trace16-even.csv", "trace16-after.csv",
                                   "trace16-v4a.csv", "trace16-v4b.csv")}
    for name, f in new.items():
        assert f["sizes"] != base["sizes"], name
        assert abs(f["vgg16"] - base["vgg16"]) > 0.1, name
        assert abs(f["load"] - base["load"]) > 0.2, name
    assert new["trace16-bursty.csv"]["bunched"] > 0.6 > base["bunched"]  # most arrivals within 2 s of the last
    assert new["trace16-after.csv"]["bunched"] > 0.7 > base["bunched"]  # in threes
    assert new["trace16-v4a.csv"]["paired"] and not base["paired"]  # in twos: each pair's second within 2 s
    assert new["trace16-v4b.csv"]["bunched"] == 0.0 < base["bunched"]  # evenly spaced


@pytest.mark.parametrize("argv, what", [
    (["--sizes", "1:0.5,20:0.5"], "--sizes: every size must be 1 to 16 GPUs"),
    (["--models", "bert:1"], "--models: ['bert'] not among"),
    (["--models", "vgg16"], "--models: 'vgg16' is not NAME:WEIGHT"),
    (["--iterations", "50"], "--iterations must be LO:HI"),
    (["--iterations", "90:30"], "--iterations must be LO:HI with 1 <= LO <= HI"),
    (["--arrivals", "sometimes"], "--arrivals must be one of poisson, bursty, even"),
])
def test_a_wrong_option_is_refused_naming_it(capsys, argv, what):
    assert trace_gen.main(argv) == 2
    assert what in capsys.readouterr().err

"""What `optirack simulate --help` shows is the validated model, and its bad flags say what is wrong in their unit.

The first example of the --help is run as printed (from another directory, its --out moved to a temporary folder) and
checked against the newest committed `make demo` record of the paper rack's fabric: the same iterations as the demo,
that record's sharing, and the job of concern's mean iteration and completion within the fidelity tolerance of what
the record measured.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from evidence import records
from simulator.cli import case_record
from simulator.cli import flags as simulate_flags
from simulator.cli import main as cli
from simulator.model import calibration, fidelity
from simulator.studies import sweep

BIN = Path(sys.executable).parent


def _help_examples() -> list[str]:
    out = subprocess.run([str(BIN / "optirack"), "simulate", "--help"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    text = " ".join(out.split())  # argparse wraps the epilog
    examples = text.split("Examples:", 1)[1]
    return [e.strip().rstrip(".") for e in re.split(r";\s+(?=optirack simulate)", examples)
            if e.strip().startswith("optirack simulate")]


def test_the_help_shows_the_examples_the_module_keeps():
    shown = _help_examples()
    assert shown[0] == simulate_flags.EXAMPLES[0]
    assert len(shown) == len(simulate_flags.EXAMPLES) and all(e.startswith(x.split(" --out")[0]) for e, x in
                                                   zip(shown, simulate_flags.EXAMPLES, strict=True))


def test_the_first_help_example_is_the_newest_record_within_the_fidelity_tolerance(tmp_path, monkeypatch, capsys):
    argv = shlex.split(_help_examples()[0].split(" --out ")[0])[2:]  # after "optirack simulate"
    monkeypatch.chdir(tmp_path)  # not the checkout: the rack file is found by name
    assert cli.standalone(["simulate", *argv, "--out", str(tmp_path / "out"), "--quiet", "--no-plots"]) == 0
    capsys.readouterr()
    result = json.loads((tmp_path / "out" / "results.json").read_text())

    newest = case_record.newest_record("lossless")
    assert newest is not None, "no whole lossless record is committed"
    record = json.loads(newest.read_text())
    assert result["fidelity_record"] == newest.stem
    assert f"{record['settings']['iterations']} iterations of the job of concern" in result["workload"]["description"]
    assert result["net"]["sharing"] == calibration.sharing_of(record) == "maxmin"
    assert newest.stem in result["net"]["source"]

    case = next(p for p in record["points"] if p["case"] == "a")
    tol = fidelity.RECORD_TOLERANCE
    for policy in ("fixed", "regroup"):
        concern = result["policies"][policy]["jobs"][0]
        emulated_iteration = case[policy]["mean_iteration_rack_s"]
        emulated_completion = case[policy]["completion_rack_s"]
        assert abs(concern["mean_iteration_s"] / emulated_iteration - 1) <= tol, (policy, concern, emulated_iteration)
        assert abs(concern["jct_s"] / emulated_completion - 1) <= tol, (policy, concern, emulated_completion)
    assert result["fidelity"] and all(abs(p["error"]) <= tol for p in result["fidelity"])


def test_the_newest_record_is_of_the_fabric_asked_for():
    lossless, droptail = case_record.newest_record("lossless"), case_record.newest_record("droptail")
    assert lossless is not None and droptail is not None
    assert json.loads(lossless.read_text())["fabric"] == "lossless"
    assert droptail.name == records.DROPTAIL.name  # the one whole droptail record
    assert case_record.newest_record("no such fabric") is None


CASE = ["--case", "a"]
GEN = ["--gpus", "32", "--gpus-per-switch", "8", "--jobs", "4", "--failures", "swap"]


@pytest.mark.parametrize(("args", "says"), [
    (GEN + ["--server-mtbf-h", "-1"], "--server-mtbf-h is in hours and must be positive, not -1"),
    (GEN + ["--repair-h", "-2"], "--repair-h is in hours and must be 0 or more, not -2"),
    (GEN + ["--swap-s", "-1"], "--swap-s is in seconds and must be 0 or more, not -1"),
    (GEN + ["--restart-s", "inf"], "--restart-s is in seconds and must be 0 or more, not inf"),
    (GEN + ["--checkpoint-s", "0"], "--checkpoint-s is in seconds and must be positive, not 0"),
    (CASE + ["--efficiency", "1.5"], "--efficiency is a fraction of the line rate in (0, 1]"),
    (CASE + ["--efficiency", "0"], "--efficiency is a fraction of the line rate in (0, 1]"),
    (CASE + ["--step-latency-us", "-3"], "--step-latency-us is in rack microseconds, 0 or more, not -3"),
    (CASE + ["--calibration", "results/records/no-such.json"], "--calibration results/records/no-such.json: no such"),
    (CASE + ["--iterations", "0"], "--iterations must be between 1"),
    (["--gpus", "32", "--gpus-per-switch", "8", "--jobs", "4", "--iterations", "5"], "--iterations is for --case"),
    (GEN + ["--control-overhead-ms", "-1000"], "--control-overhead-ms must be 0 or more, not -1000"),
    (GEN + ["--oddl-switch-ns", "-1"], "--oddl-switch-ns must be a finite time of 0 or more, not -1"),
    (GEN + ["--oddl-control-us", "-2"], "--oddl-control-us must be a finite time of 0 or more, not -2"),
    (GEN + ["--sipml-setup-us", "inf"], "--sipml-setup-us must be a finite time of 0 or more, not inf"),
    (GEN + ["--topoopt-degree", "0"], "--topoopt-degree must be at least 1, not 0"),
    (GEN + ["--sipml-gbps", "0"], "--sipml-gbps must be positive, not 0"),
    (GEN + ["--mltcp-slope", "-1"], "--mltcp-slope must be a finite number of 0 or more, not -1"),
])
def test_a_bad_flag_exits_2_naming_the_flag_and_its_unit(tmp_path, capsys, args, says):
    out = tmp_path / "out"
    assert cli.standalone(["simulate", *args, "--out", str(out), "--quiet", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert not out.exists()  # nothing written


def test_a_calibration_that_is_not_a_record_is_refused(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    assert cli.standalone(["simulate", *CASE, "--calibration", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert f"--calibration {bad}: not a make demo record" in capsys.readouterr().err


def test_sweep_refuses_hours_in_hours(tmp_path, capsys):
    parser = __import__("argparse").ArgumentParser(prog="optirack")
    sweep.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sweep", "--server-mtbf-h", "-1", "--out", str(tmp_path / "s")])
    assert args.func(args) == 2
    assert "--server-mtbf-h is in hours and must be positive, not -1" in capsys.readouterr().err


def test_a_trace_job_larger_than_the_rack_is_said_on_the_console(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,gpus,model,iterations\n0,4,vgg16,5\n1,64,vgg16,5\n")
    assert cli.standalone(["simulate", "--gpus", "32", "--gpus-per-switch", "8", "--trace", str(trace),
                           "--policies", "fixed", "--out", str(tmp_path / "o"), "--quiet", "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert "jobs left out, larger than the rack's 32 GPUs: 1" in err and "--strict" in err, err


def test_case_slowdowns_are_at_least_1_and_no_cell_is_nan(tmp_path, capsys):
    assert cli.standalone(["simulate", *CASE, "--out", str(tmp_path / "o"), "--quiet", "--no-plots"]) == 0
    shown = capsys.readouterr().out
    assert "nan" not in shown
    result = json.loads((tmp_path / "o" / "results.json").read_text())
    for policy in result["policies"].values():
        assert all(j["slowdown"] >= 0.99 for j in policy["jobs"]), policy["jobs"]

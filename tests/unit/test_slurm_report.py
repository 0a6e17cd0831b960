"""The Slurm blocks of docs/slurm.md (evidence/report/slurm.py) from records written as scripts/slurm_experiment.py
writes them, here made up in a temporary directory: what each column holds, and the error when no record has the
block's part."""
from __future__ import annotations

import json

import pytest

from evidence.report import slurm as blocks
from evidence.report.bench import ReportError


def _round(arm, requeued, again, iterating, lost, final="COMPLETED"):
    return {"arm": arm, "requeued_s": requeued, "started_again_s": again, "iterating_again_s": iterating,
            "iterations_lost": lost, "checkpoint_every": 5, "final": final}


def test_the_failover_table_gives_each_arms_median_and_range_and_what_holds_both(tmp_path):
    rounds = [_round("optirack", 0.6, 11.0, 14.0, 3), _round("optirack", 0.8, 12.0, 16.0, 1),
              _round("optirack", 1.0, 13.0, 15.0, 2), _round("slurm alone", 31.0, 42.0, 45.0, 3)]
    (tmp_path / "r1.json").write_text(json.dumps({"failover": {"slurmd_timeout_s": 30, "cred_expire_s": 10,
                                                               "rounds": rounds}}))
    (tmp_path / "r0.json").write_text(json.dumps({"case_a": {}}))  # another part: no row
    header, _, mine, alone, _, note = blocks.failover([], tmp_path).splitlines()
    assert header.startswith("| record | who tells Slurm |")
    assert mine == "| `r1` | optirack, at once | 3 | 0.80 s (0.60 s–1.00 s) | 12.00 s (11.00 s–13.00 s) | " \
                   "15.00 s (14.00 s–16.00 s) | 2 (1–3) (5) | COMPLETED |"
    assert alone.startswith("| `r1` | Slurm alone (SlurmdTimeout 30 s) | 1 | 31.00 s |")
    assert "cred_expire (10 s)" in note


def test_the_prolog_table_gives_the_prologs_time_and_slurmctlds_answers(tmp_path):
    summary = {"jobs": 50, "prologs": 50, "prolog_p50_s": 0.12, "prolog_p99_s": 0.41, "prolog_max_s": 0.45,
               "squeue_p50_s": 0.011, "squeue_max_s": 0.2, "squeue_during_reload_max_s": None,
               "squeue_during_reload": 0, "reconfigures": 7, "failed": 0, "unchanged": 30, "most_in_flight": 1}
    (tmp_path / "r2.json").write_text(json.dumps({"prolog_cost": {"summary": summary}}))
    row = blocks.prolog([], tmp_path).splitlines()[-1]
    assert row == ("| `r2` | 50 of 50 | 0.120 s | 0.410 s | 0.450 s | 0.011 s | 0.200 s | - (0) | 7 (failed 0) | 30 "
                   "| 1 |")


@pytest.mark.parametrize("block, option", [(blocks.failover, "--failover"), (blocks.prolog, "--prolog-cost")])
def test_no_record_of_the_part_is_an_error_naming_the_command(tmp_path, block, option):
    (tmp_path / "r0.json").write_text(json.dumps({"case_a": {}}))
    with pytest.raises(ReportError, match=f"no committed record under {tmp_path}.*slurm_experiment {option}"):
        block([], tmp_path)

"""scripts/run_tests.py (make test's two runs at once): its exit status fails when either run fails, the rack-free
run's output is printed whole, and the runs are what make test means (integration apart, every other test beside)."""
from __future__ import annotations

import sys

import pytest

from scripts import run_tests


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("beside_rc,rack_rc,expected", [(0, 0, 0), (1, 0, 1), (0, 2, 1), (3, 4, 1)])
def test_the_status_fails_when_either_run_fails(monkeypatch, capsys, beside_rc, rack_rc, expected):
    beside = _py(f"import sys, time; time.sleep(0.3); print('beside says hello'); sys.exit({beside_rc})")
    rack = _py(f"import sys; print('rack says hello'); sys.exit({rack_rc})")
    monkeypatch.setattr(run_tests, "commands", lambda workers, extra: (beside, rack))
    assert run_tests.main([]) == expected
    out = capsys.readouterr().out
    assert "beside says hello" in out  # the log, printed after both ended
    assert f"(exit {beside_rc}," in out and f"(exit {rack_rc}," in out


def test_the_two_runs_split_the_suite_by_the_integration_mark():
    beside, rack = run_tests.commands("2", ["-v"])
    assert beside[:3] == ["nice", "-n", str(run_tests.NICE)]

    def after(argv: list[str], flag: str) -> str | None:  # pytest's own option (after `-m pytest`)
        own = argv[argv.index("pytest") + 1:]
        return own[own.index(flag) + 1] if flag in own else None

    assert after(beside, "-m") == "not integration" and after(beside, "-n") == "2"
    assert after(rack, "-m") == "integration" and after(rack, "-n") is None
    assert beside[-1] == rack[-1] == "-v"

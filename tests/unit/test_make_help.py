"""`make help` and the other --helps say what is there: every declared target has a rule and a line in `make help`,
`optirack sweep --help` prints no doubled percent sign, `optirack-controller --help` shows each option's default."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _phony() -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()


@pytest.mark.parametrize("target", [t for t in _phony() if t != "help"])
def test_every_declared_target_has_a_rule_and_a_help_line(target):
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), target], capture_output=True, text=True, timeout=60)
    said = dry.stdout + dry.stderr
    assert dry.returncode == 0 and dry.stdout.strip() and "Nothing to be done" not in said, f"make {target}: {said}"
    shown = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True, text=True, timeout=60).stdout
    assert re.search(rf"^make {re.escape(target)}\s", shown, re.M), f"make help has no line for {target}"


def test_make_help_says_rack_cli_builds_its_own_rack():
    shown = subprocess.run(["make", "-s", "-C", str(ROOT), "help"], capture_output=True, text=True, timeout=60).stdout
    line = next(x for x in shown.splitlines() if x.startswith("make rack-cli"))
    assert "build" in line and "tears it down" in line, line


def test_sweep_help_prints_one_percent_sign():
    out = subprocess.run([str(BIN / "optirack"), "sweep", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "95 %" in out.stdout and "%%" not in out.stdout


def test_the_controller_help_shows_defaults():
    out = subprocess.run([str(BIN / "optirack-controller"), "--help"], capture_output=True, text=True, timeout=120)
    text = " ".join(out.stdout.split())
    assert "--optirack-state-dir OPTIRACK_STATE_DIR where the job table, circuits and token are kept (default: " \
           "/var/lib/optirack)" in text, text[:3000]
    # the defaults the launcher sets, not Ryu's own (Ryu's help says 0.0.0.0)
    wsapi = re.search(r"--wsapi-host WSAPI_HOST (.*?) --wsapi-port", text).group(1)
    assert wsapi.endswith("(default: 127.0.0.1)") and "0.0.0.0" not in wsapi, wsapi

"""The simulator installs and runs without root: `pip install` of the project into a fresh, plain virtualenv (no
Debian package, no extra) by a user without root, then `optirack simulate` (the paper's case and the sample trace,
found by name from another directory) and `optirack sweep`, and neither imports Ryu, eventlet, Docker or Mininet.

As root (make test), the check runs as `nobody` (runuser) on a copy of the committed tree it may read; as another
user, as that user. pip reads the packages from this machine's configured indexes (pip.conf) into a cache of the
test's own. It takes about a minute and needs no rack: it is marked `install`, and `make test` runs it beside the
integration tests (scripts/run_tests.py); `make test-unit` does not.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("check-install.sh")

pytestmark = pytest.mark.install


def _copy_tree(dest: Path) -> None:
    """The files git tracks (what a clone has), and the demo records the tests read, copied to `dest`."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True,
                           timeout=60).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.fixture
def work():
    """A folder of its own in /tmp (pytest's is private to root), removed afterwards, pass or fail."""
    path = Path(tempfile.mkdtemp(prefix="optirack-install-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(900)
def test_the_simulator_installs_and_runs_without_root(work):
    if shutil.which("git") is None:
        pytest.fail("git is needed to copy the tracked tree")
    (work / "src").mkdir()
    _copy_tree(work / "src")
    shutil.copy2(SCRIPT, work / "check-install.sh")
    command = ["bash", str(work / "check-install.sh"), str(work)]
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.fail("runuser is needed to run the check as a user without root")
        subprocess.run(["chown", "-R", "nobody:nogroup", str(work)], check=True, timeout=120)
        command = ["runuser", "-u", "nobody", "--", *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=840,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "uid 0" not in proc.stdout and "install check: passed" in proc.stdout, out[-4000:]
    # the paper's case ran the demo's validated defaults: the newest lossless record, the demo's 12 iterations
    summary = (work / "run" / "sim-a" / "summary.md").read_text()
    assert "12 iterations of the job of concern" in summary and "max-min" in summary, summary[:2000]

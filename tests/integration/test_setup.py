"""`make setup` is idempotent: run again (make test has just run it), it changes nothing."""
import subprocess
import time

from tests.integration.helpers import ROOT


def test_second_setup_does_nothing():
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, cwd=ROOT)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "setup: nothing to do" in proc.stdout, proc.stdout
    assert "started" not in proc.stdout and "building" not in proc.stdout
    print(f"second make setup: {elapsed:.1f} s")

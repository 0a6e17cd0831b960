"""make test's two test runs, at the same time: the integration tests (marked `integration`: one at a time, as they
share one emulated rack) in the foreground, and beside them every other test (the unit tests and the install test,
which need no rack) on the cores the integration tests leave idle while they wait on containers, engines and
daemons. The second run is niced, so that the integration tests' timing stays as when they ran alone; its output goes
to a log that is printed, whole, once both have ended. The exit status is non-zero when either run failed.

    python -m scripts.run_tests [--workers N] [-- PYTEST_ARGS...]

Stopped (Ctrl-C, SIGTERM), it stops both runs (their process groups: only what it started) and waits for them.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NICE = 5  # the run beside the integration tests yields the CPU to them


def commands(workers: str, extra: list[str]) -> tuple[list[str], list[str]]:
    """(the rack-free run, the integration run) as argv lists."""
    py = [sys.executable, "-m", "pytest"]
    beside = ["nice", "-n", str(NICE), *py, "-m", "not integration", "-n", workers, "--dist", "loadfile", "tests",
              *extra]
    rack = [*py, "-m", "integration", "tests", *extra]
    return beside, rack


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.run_tests", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="auto",
                    help="pytest-xdist workers for the run beside the integration tests (default: auto, one per "
                         "core)")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER,
                    help="after --: arguments given to both pytest runs (as make test's PYTEST_ARGS)")
    args = ap.parse_args(argv)
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    beside_cmd, rack_cmd = commands(args.workers, extra)

    log = tempfile.NamedTemporaryFile(prefix="optirack-tests-", suffix=".log", delete=False)
    print(f"run_tests: unit and install tests beside the integration tests, niced, output to {log.name} "
          f"(printed when both end):\n  {shlex.join(beside_cmd)}", flush=True)
    t0 = time.monotonic()
    beside = subprocess.Popen(beside_cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rack = None
    ended: dict[str, float] = {}

    def beside_ends() -> None:  # says when the run beside ends, while the integration tests go on
        beside.wait()
        ended["unit and install"] = time.monotonic() - t0
        print(f"\nrun_tests: the unit and install tests ended after {ended['unit and install'] / 60:.1f} min "
              f"({'passed' if beside.returncode == 0 else 'FAILED'}; output below at the end)", flush=True)

    waiter = threading.Thread(target=beside_ends, daemon=True)
    waiter.start()
    try:
        print(f"run_tests: integration tests, one at a time:\n  {shlex.join(rack_cmd)}", flush=True)
        rack = subprocess.Popen(rack_cmd, cwd=ROOT, start_new_session=True)
        rack.wait()
        ended["integration"] = time.monotonic() - t0
        waiter.join()
    except KeyboardInterrupt:
        print("\nrun_tests: interrupted; stopping both runs", file=sys.stderr, flush=True)
        return 130
    finally:
        for proc in (rack, beside):
            if proc is not None:
                _stop(proc)
        waiter.join(timeout=5)
        log.close()
        if beside.returncode is not None:
            print(f"\n===== the unit and install tests' output ({log.name}) =====", flush=True)
            sys.stdout.write(Path(log.name).read_text(errors="replace"))
            sys.stdout.flush()
    print(f"\nrun_tests: unit and install tests {'passed' if beside.returncode == 0 else 'FAILED'} "
          f"(exit {beside.returncode}, {ended['unit and install'] / 60:.1f} min); integration tests "
          f"{'passed' if rack.returncode == 0 else 'FAILED'} (exit {rack.returncode}, "
          f"{ended['integration'] / 60:.1f} min); both in {(time.monotonic() - t0) / 60:.1f} min", flush=True)
    os.unlink(log.name)
    return 0 if beside.returncode == 0 and rack.returncode == 0 else 1


def _terminate(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())

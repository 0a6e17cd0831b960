"""emulation/procs.py: a PID file's process counts only while it runs and is the program we started."""
from __future__ import annotations

import subprocess
import time

from emulation import procs


def test_a_pid_file_names_our_process_only_while_it_runs_and_is_that_program(tmp_path):
    child = subprocess.Popen(["sleep", "30"])
    try:
        # Popen returns once the exec has begun, not once it has ended: until the kernel has set the new program's
        # arguments, /proc names the old one's (or none) beside the new executable. Wait for the exec to end.
        deadline = time.monotonic() + 5
        while procs.cmdline(child.pid) != [b"sleep", b"30"] and time.monotonic() < deadline:
            time.sleep(0.001)
        path = tmp_path / "sleep.pid"
        path.write_text(f"{child.pid}\n")
        assert procs.from_file(path, "sleep") == child.pid
        assert procs.from_file(path, "sleep", marker="30") == child.pid
        assert procs.from_file(path, "dockerd") is None  # a reused PID of another program is not ours
        assert procs.from_file(path, "sleep", marker=str(tmp_path)) is None  # nor one started for another folder
    finally:
        child.kill()
    deadline = time.monotonic() + 5
    while procs.alive(child.pid) and time.monotonic() < deadline:  # a zombie child counts as gone, and is reaped
        time.sleep(0.01)
    assert not procs.alive(child.pid) and procs.from_file(path, "sleep") is None


def test_a_file_without_a_pid_names_nothing(tmp_path):
    assert procs.read_pid(tmp_path / "missing.pid") is None
    (tmp_path / "bad.pid").write_text("not a number")
    assert procs.read_pid(tmp_path / "bad.pid") is None and procs.from_file(tmp_path / "bad.pid") is None


def test_a_process_in_the_middle_of_its_exec_is_not_named_ours(monkeypatch):
    # Right after Popen returns, /proc may show the new executable with no arguments yet: a marker cannot be
    # checked then, so the process is not named ours (it is, a moment later, once its exec has ended).
    monkeypatch.setattr(procs, "alive", lambda pid: True)
    monkeypatch.setattr(procs.Path, "read_bytes", lambda self: b"")
    assert procs.cmdline(1) == []
    assert not procs.ours(1, "sleep")


def test_a_signal_reaches_each_live_pid_and_passes_over_those_gone():
    import signal

    live, gone = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["true"])
    gone.wait()
    try:
        assert procs.signal_all([live.pid, gone.pid], signal.SIGKILL) == 1
        assert live.wait(timeout=10) == -signal.SIGKILL
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()

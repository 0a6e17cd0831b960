"""Processes this project started, known by their PID files: whether a PID still runs, and whether it is ours.

A PID file can outlive its process and a PID is reused, so a PID read from a file counts only if the process runs
(a zombie does not: it is reaped here where it is our own child) and is the program we started: its executable's or
its argv[0]'s name starts with `program`, and `marker` (a path of ours: its PID file, its run folder, a module
name) is in its command line. Every emulation module that ends what it started asks here, never by a process name
alone (pkill), so nothing of another user's is ended.
"""
from __future__ import annotations

import os
from pathlib import Path


def reap(pid: int) -> None:
    """Collect `pid` if it is our own child that has exited (no zombie left that still looks alive)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def alive(pid: int) -> bool:
    """Whether the process runs; a zombie is gone (reaped here if it is our own child)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    if state == "Z":
        reap(pid)
        return False
    return True


def cmdline(pid: int) -> list[bytes]:
    """The process's arguments ([] where it is gone, or has none yet: in the middle of its exec)."""
    try:
        data = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0")
    except OSError:
        return []
    return data.split(b"\0") if data else []


def ours(pid: int, program: str | None = None, marker: str | None = None) -> bool:
    """Whether `pid` runs and is the program we started: `program` the start of its executable's or argv[0]'s name,
    `marker` somewhere in its command line (each checked where given)."""
    if not alive(pid):
        return False
    args = cmdline(pid)
    if not args:
        return False
    if program is not None:
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            exe = ""
        if not (exe.startswith(program) or os.path.basename(args[0].decode(errors="replace")).startswith(program)):
            return False
    return marker is None or marker.encode() in b"\0".join(args)


def read_pid(path: Path) -> int | None:
    """The PID a PID file holds (its first word), None where there is no such file or no number in it."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def from_file(path: Path, program: str | None = None, marker: str | None = None) -> int | None:
    """The PID in the PID file `path` if that process is ours (`ours`), else None (a stale file names nothing)."""
    pid = read_pid(path)
    return pid if pid is not None and ours(pid, program, marker) else None


def signal_all(pids: list[int], sig: int) -> int:
    """Send `sig` to each of `pids` (ours, found by the caller); those already gone are passed over. How many got it."""
    sent = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            pass
    return sent

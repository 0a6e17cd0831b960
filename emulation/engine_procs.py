"""What an emulated server's Docker Engine leaves behind when it stops or crashes, found and ended by what the rack
itself started (the PID file and exec root of emulation/engine_plan.py's EnginePlan, never a process name): its
containerd (`containerd_pid`, `stop_containerd`), its containerd shims and the containers they run (`shim_pids`,
`container_inits`, `kill_shims`), and the mounts under its roots (`unmount_leftovers`); emulation/procs.py tells a
running process of ours from a gone one. emulation/engines.py starts and stops the engines with these;
emulation/servers.py kills a whole server with them.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from emulation import procs
from emulation.engine_plan import EnginePlan


def containerd_pid(plan: EnginePlan) -> int | None:
    """The containerd the engine started, if it runs (its PID file says which)."""
    return procs.from_file(plan.run_dir / "exec" / "containerd" / "containerd.pid", "containerd", str(plan.run_dir))


def stop_containerd(plan: EnginePlan) -> None:
    """Stop the containerd a crashed engine left running (killed if it does not stop)."""
    pid = containerd_pid(plan)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while procs.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if procs.alive(pid):  # hung: blocked writing its log to a pipe nobody reads any more
        os.kill(pid, signal.SIGKILL)  # its shims, and the containers, run on
        deadline = time.monotonic() + 10
        while procs.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def shim_pids(plan: EnginePlan) -> list[int]:
    """The containerd shims of this engine, named by its exec root."""
    root = str(plan.run_dir / "exec").encode()
    shims = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline.split(b"\0", 1)[0] and root in cmdline:
            shims.append(int(proc.name))
    return shims


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def container_inits(plan: EnginePlan) -> list[int]:
    """The init process of every container this engine's shims run."""
    return [c for shim in shim_pids(plan) for c in children(shim)]


def kill_shims(plan: EnginePlan) -> int:
    """Kill the containerd shims of this engine (named by its exec root) and the containers they ran."""
    shims = shim_pids(plan)
    for shim in shims:
        for pid in [*children(shim), shim]:  # a container's init first: its PID namespace goes with it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    while any(procs.alive(p) for p in shims) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(shims)


def unmount_leftovers(plan: EnginePlan) -> int:
    """Unmount what a stopped engine left mounted under its roots (deepest first)."""
    roots = (str(plan.data_root), str(plan.run_dir))
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(roots):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
    return len(points)

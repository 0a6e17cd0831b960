"""What a record says about where it came from (versions, commit, model hash), and writing one that never
overwrites another (results/records/<UTC time>-<commit>.json, simulator/records.py)."""
from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _first_line(*args: str) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0] if out.returncode == 0 and lines else None


def git_state(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """(short commit, whether tracked files differ from it), or (None, None) outside git."""
    commit = _first_line("git", "-C", str(root), "rev-parse", "--short", "HEAD")
    if commit is None:
        return None, None
    try:
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return commit, None
    return commit, bool(status.stdout.strip()) if status.returncode == 0 else None


def versions(full: bool = True) -> dict:
    """The versions a figure was measured with: the checkout (commit, dirty), python and the kernel; with `full`,
    torch, Open vSwitch, Docker and Mininet too (slower: torch is imported)."""
    commit, dirty = git_state()
    out = {"optirack": commit, "git_dirty": dirty, "python": platform.python_version(), "kernel": platform.release()}
    if full:
        try:
            import torch

            out["torch"] = torch.__version__
        except ImportError:
            out["torch"] = None
        out |= {"openvswitch": _first_line("ovs-vsctl", "--version"),
                "docker": _first_line("docker", "version", "--format", "{{.Server.Version}}"),
                "mininet": _first_line("mn", "--version")}
    return out


def utc_stamp(t: float | None = None) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def write_new(path: Path, record: dict) -> Path:
    """Write `record` to `path`, which must not exist yet (a record is never overwritten)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x") as f:  # FileExistsError rather than replace an earlier record
        f.write(json.dumps(record, indent=1))
    return path

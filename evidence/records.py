"""The committed records, read and written in one place: the `make demo` records under results/records/, and what
every record says about where it came from (versions, commit), written so that none overwrites another.

Every `make demo` writes one record, never overwriting another: results/records/<UTC start>-<commit>.json
(<commit>-dirty when the checkout had uncommitted changes), its tables and figures in the directory of the
same stem beside it (`stem`, `write_new`); benchmarks and replays are named alike. The model that made a record is
known by its fingerprint (docs/model-fingerprint.md): its own `model_fingerprint`, or the one computed at its
commit and written beside it as <stem>.fingerprint. The format itself is read by evidence/records.py (which
`optirack simulate --case` uses on the copy `pip install` ships); this module adds where the committed ones are and
which of them check the model.
"""
from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

from simulator.inputs.records import DROPTAIL_NAME, LOSSLESS_FIRST_NAME, Record, committed, fingerprint_of, stem  # noqa: F401
from simulator.inputs.records import load as load_from

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "results" / "records"
# The record the simulator's `held` sharing was chosen on (droptail fabric, before records carried a model hash):
# the fidelity test's check of it stays as it was, and `optirack simulate --case` compares with it by default.
DROPTAIL = RECORDS / f"{DROPTAIL_NAME}.json"
# The first record on the lossless fabric (one run, before the uplink was re-fitted on it).
LOSSLESS_FIRST = RECORDS / f"{LOSSLESS_FIRST_NAME}.json"


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


def load(directory: Path = RECORDS, tracked_only: bool = True) -> list[Record]:
    """Every committed `make demo` record in `directory` (default results/records/), oldest first
    (evidence/records.py `load`)."""
    return load_from(directory, tracked_only)


def of_current_model(records: list[Record], fingerprint: str | None = None) -> list[Record]:
    """The whole records made with the simulator's model as it is now (its committed fingerprint, or
    `fingerprint`): the ones that check it."""
    from simulator import identity

    now = fingerprint or identity.fingerprint()
    return [r for r in records if r.full and now is not None and r.fingerprint == now]


def with_model(fingerprint: str, directory: Path = RECORDS) -> list[Record]:
    """The full records made with the model whose fingerprint is `fingerprint`: the ones that check it."""
    return of_current_model(load(directory), fingerprint)

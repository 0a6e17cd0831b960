"""A `make demo` record as the simulator reads it: its name, whether it is whole, which model made it, and the records
of a folder (`optirack simulate --case` calibrates from one and compares with it; evidence/records.py adds where
the committed ones are, and writes them).

A record is named <UTC start>-<commit>.json (<commit>-dirty when the checkout had uncommitted changes). The model
that made it is known by its fingerprint (simulator/identity.py): the record's own `model_fingerprint`, or for records
made before fingerprints, the one computed at the record's commit and written beside it as <stem>.fingerprint
(`python -m evidence.fingerprint --records`; where it cannot be computed, that file says why). Records also carry
`model_hash`, the older hash over the model's files, None in the two made before it.
"""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

STEM = re.compile(r"^(\d{8}T\d{6}Z)-([0-9a-f]{4,40}|nogit)(-dirty)?$")
# The record the simulator's `held` sharing was chosen on (droptail fabric), and the first on the lossless fabric
DROPTAIL_NAME = "20261123T132449Z-8c2fd57"
LOSSLESS_FIRST_NAME = "20261123T230651Z-efafd5d"


@dataclass(frozen=True)
class Record:
    path: Path
    data: dict

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def model_hash(self) -> str | None:
        return self.data.get("model_hash")

    @property
    def fingerprint(self) -> str | None:
        return fingerprint_of(self.path, self.data)

    @property
    def full(self) -> bool:
        """A whole demo (both cases, each pair repeated at least 3 times): what the results tables show and the
        fidelity test checks. A quick run (`--quick`: case (a) once) is a record too, listed, but neither."""
        return {p["case"] for p in self.data["points"]} >= {"a", "b"} \
            and self.data.get("settings", {}).get("repeats", 1) >= 3


def stem(started_utc: str, commit: str | None, dirty: bool) -> str:
    """'20261123T132449Z-8c2fd57' from a UTC time '20261123T132449Z' and the short commit."""
    name = f"{started_utc}-{commit or 'nogit'}{'-dirty' if dirty else ''}"
    if not STEM.match(name):
        raise ValueError(f"not a record name: {name!r}")
    return name


def committed(directory: Path) -> set[str] | None:
    """The names of the files git tracks in `directory`, or None where it is not in a git work tree (then every
    file counts)."""
    try:
        proc = subprocess.run(["git", "-C", str(directory), "ls-files", "-z", "--", "."], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {Path(f).name for f in proc.stdout.decode().split("\0") if f}


def fingerprint_of(path: Path, data: dict) -> str | None:
    """The fingerprint of the model that made the record at `path`: its own `model_fingerprint`, else the one
    computed at its commit beside it (<stem>.fingerprint); None where neither is known."""
    if data.get("model_fingerprint"):
        return data["model_fingerprint"]
    try:
        found = json.loads(path.with_suffix(".fingerprint").read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def load(directory: Path, tracked_only: bool = True) -> list[Record]:
    """Every committed record in `directory` (in a git work tree, the ones git tracks: a demo's new record counts
    once it is committed, so a `make test` after a `make demo` reads what the repository holds), oldest first; a
    file that is not one is an error naming it. `tracked_only=False`: every file, git or not (the copy `pip install`
    makes, which may lie untracked inside some work tree)."""
    out = []
    tracked = committed(directory) if directory.is_dir() and tracked_only else None
    for path in sorted(directory.glob("*.json")):
        if tracked is not None and path.name not in tracked:
            continue
        if not STEM.match(path.stem):
            raise ValueError(f"{path}: not named <UTC time>-<commit>.json")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read the record: {e}") from None
        if not isinstance(data, dict) or "runs" not in data or "points" not in data:
            raise ValueError(f"{path}: not a make demo record (no runs or points)")
        out.append(Record(path, data))
    return out

"""Which model of the simulator this is: its fingerprint, a hash of its predictions on a fixed probe set.

evidence/fingerprint.py computes it (`python -m evidence.fingerprint`) and writes it, with each probe's own hash, to
simulator/fingerprint.json (`--write`), shipped with the simulator; tests/unit/test_fingerprint.py fails where that
file is stale. `fingerprint()` reads it, so that choosing the records that check the model costs nothing: a record
checks the current model only if its fingerprint is this one (docs/model-fingerprint.md).
"""
from __future__ import annotations

import json
from pathlib import Path

FINGERPRINT = Path(__file__).resolve().parent / "fingerprint.json"


def fingerprint() -> str | None:
    """The model's fingerprint committed with this checkout (simulator/fingerprint.json), None without one."""
    try:
        return json.loads(FINGERPRINT.read_text())["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None

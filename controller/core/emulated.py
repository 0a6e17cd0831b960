"""Where this host's emulated rack keeps its run-time state, and what the controller's tools may read of it.

The emulation (emulation/) writes here; the controller only reads, so it never imports the emulation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RUN_DIR = Path(os.environ.get("OPTIRACK_RUN_DIR", "/run/optirack"))
STATE_FILE = "rack.json"  # under RUN_DIR: what `optirack-rack up` made (emulation.rack.RackState)


def emulated_rack_name() -> str | None:
    """The name of the emulated rack that is up on this host, or None."""
    try:
        return json.loads((RUN_DIR / STATE_FILE).read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return None

"""make report's blocks from the simulator's committed records (results/simulate-*/, results/bench-simulate.json;
scripts/report.py merges BLOCKS)."""
from __future__ import annotations

from collections.abc import Callable

BLOCKS: dict[str, Callable[[list], str]] = {}

"""What one `make demo` runs: its settings (iterations, repeats, the sweep, the rack file, the fabric), beside both
modules that read them (experiment.py, runs.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from emulation.harness import ROOT

PAPER_RACK = ROOT / "topologies" / "paper-testbed.yaml"


@dataclass
class Settings:
    iterations: int
    repeats: int
    model: str = "vgg16"
    results: Path = ROOT / "results"
    sweep: list[float] = field(default_factory=list)  # k: an uplink runs at 1/k of a GPU NIC's line rate
    sweep_iterations: int = 0
    rack_file: Path = PAPER_RACK
    recalibrate: bool = True  # calibrate again after the cases (--quick: once, before them)
    fabric: str | None = None  # lossless or droptail: overrides the rack file's emulation.fabric

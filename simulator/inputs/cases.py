"""The paper's two cases (Yan et al., OFC 2022, Fig. 3): the job of concern and the job beside it, by GPU name on
the paper's rack. `make demo` (evidence/demo/experiment.py) runs them on the emulated rack; `optirack simulate --case`
replays them in the simulator. One definition for both."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Case:
    name: str
    concern: list[str]  # the job the paper reports (red)
    other: list[str]  # the job running beside it (blue)
    label: str = ""


CASES = {
    # With the starting cabling, red's GPUs sit 2 + 2 (case a) or 2 + 1 (case b) under the two
    # switches and blue's 1 + 1 or 1 + 2: both rings cross the uplink, as in the paper's Fig. 3.
    "a": Case("a", ["gpu1", "gpu2", "gpu3", "gpu4"], ["gpu5", "gpu6"], "jobs of 4 and 2 GPUs"),
    "b": Case("b", ["gpu1", "gpu2", "gpu3"], ["gpu5", "gpu6", "gpu4"], "jobs of 3 and 3 GPUs"),
}

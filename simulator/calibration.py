"""The network parameters that make a simulated ring match the emulated one, from measured figures.

An emulated ring step costs (S/n) / (efficiency x line rate) plus a fixed software latency. Both
come from measurements, never from the points the fidelity test compares:
- the per-step latency from the all-reduce of tiny messages on loopback (rack file comment:
  about 40 ms per all-reduce of 4 ranks on 2 cores, i.e. 6 steps);
- the efficiency from a ring measured against its bound 2(n-1)/n * S/B (scripts/bench_allreduce.py),
  once that latency is taken out.
Emulated time runs `emulation.time_dilation` times slower than the rack's, so the latency counts
1/dilation as much in rack seconds; compute times and line rates are the rack's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from controller.core.rack import Rack
from simulator.network import NetParams

# Assumed for a real rack (no real rack was measured): RoCE/NCCL rings reach about 90 % of line
# rate, and a ring step costs tens of microseconds besides its bytes.
RACK = NetParams(efficiency=0.90, step_latency_s=20e-6)


@dataclass(frozen=True)
class Calibration:
    efficiency: float
    step_latency_emulated_s: float
    source: str

    def net(self, rack: Rack) -> NetParams:
        return NetParams(self.efficiency, self.step_latency_emulated_s / rack.spec.emulation.time_dilation)


def efficiency_from_ring(fraction_of_bound: float, n: int, size_bytes: float, rate_bps: float, step_latency_s: float) -> float:
    """The efficiency a ring measured at `fraction_of_bound` implies, its per-step latency taken out."""
    steps = 2 * (n - 1)
    bound = steps * (size_bytes / n) * 8 / rate_bps
    measured = bound / fraction_of_bound
    return bound / (measured - steps * step_latency_s)


LOOPBACK_STEP_S = 0.040 / 6  # rack file comment: ~40 ms per all-reduce of 4 ranks on loopback
# README "Fidelity of the emulated fabric": ring of 4, 16 MB at 50 Mbit/s, 91.0 % of the bound (MTU 1500)
PROVISIONAL = Calibration(efficiency_from_ring(0.910, 4, 16e6, 50e6, LOOPBACK_STEP_S), LOOPBACK_STEP_S,
                          "provisional: README bench ring 91.0 % of bound (16 MB, 4 ranks, 50 Mbit/s), "
                          "loopback latency 40 ms per 4-rank all-reduce")


def load_record(path: str | Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def from_record(record: dict | None) -> Calibration:
    """The calibration the demo measured and recorded, or the provisional figures when it has none."""
    cal = (record or {}).get("calibration")
    if not cal:
        return PROVISIONAL
    latency = cal.get("step_latency_s", LOOPBACK_STEP_S)
    eff = efficiency_from_ring(cal["fraction_of_bound"], cal["ranks"], cal["bytes"], cal["rate_bps"], latency)
    return Calibration(eff, latency, f"the demo's calibration ring: {100 * cal['fraction_of_bound']:.1f} % of its bound")

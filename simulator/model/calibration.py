"""The network parameters that make a simulated ring match the emulated one, from measured figures.

An emulated ring step costs (S/n) / (efficiency x line rate) plus a fixed cost. Both come from
measurements, never from the points the fidelity test compares:
- the fixed cost per step (STEP_S) from a ring of 4 on the emulated fabric at the paper cases'
  gradient, what each step takes beyond its bytes at the line rate (scripts/bench_allreduce.py);
- the efficiency from the demo's own calibration, recorded in its `make demo` record: a
  ring of TCP flows between GPU NICs on the rack it measures on, each flow's share of the line
  rate (emulation/calibrate.py), the median over its runs at the rate the demo used; a record
  without one falls back to the ring all-reduce benchmark of docs/emulated-rack.md, "Fidelity of the
  emulated fabric" (91.0 % of its bound with that latency taken out).
Emulated time runs `emulation.time_dilation` times slower than the rack's, so the latency counts
1/dilation as much in rack seconds; compute times and line rates are the rack's.

How rings share a link is calibrated to the emulation too, by the record's fabric (FABRIC_SHARING below): "maxmin" on
the lossless fabric (the default since 2026-11-25), and on the droptail fabric "held" (simulator/model/network.py), not
the "maxmin" assumed for a real rack. The measurement is the demo record's share of the uplink's line
rate that each crossing flow of the fragmented ring got while it communicated (its bytes over the
recorded all-reduce time; `python -m evidence.uplink`): 41-55 % at every swept rate, about the
equal share of the two rings placed on the uplink, whether or not the job beside was computing,
where max-min hands the ring what the job beside leaves idle (56-76 %). The mechanism is the
emulation's: TCP flows through a shallow drop-tail queue (8 frames, emulation/shaping.py) lose a
third of their packets there and do not regain spare capacity within the job beside's compute
phase. tests/unit/test_sim_fidelity.py checks the record bears this out (held closer than max-min).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from controller.core.rack import Rack
from simulator.model.network import NetParams

# Assumed for a real rack (no real rack was measured): RoCE/NCCL rings reach about 90 % of line
# rate, and a ring step costs tens of microseconds besides its bytes.
RACK = NetParams(efficiency=0.90, step_latency_s=20e-6, sharing="maxmin")
# The emulated fabric's sharing, from the record's crossing-flow shares (module docstring): "held" on the droptail
# fabric. The lossless fabric (emulation.fabric, the default since 2026-11-25) splits each uplink among its flows
# in per-address htb leaves and its demo checks every crossing flow's share against max-min (emulation/shares.py):
# its records are simulated with "maxmin". Chosen, with STEP_S, on the three lossless records of 2026-11-25
# (20261125T083703Z, 20261125T085601Z, 20261125T091423Z; their case (a) ran the job beside's ring of two over one
# duplex connection, fixed in the worker since) and the re-fit's record (fits/20261125T111530Z-3e78e66.json,
# `python -m evidence.uplink RECORD --fit FIT`): none of them checks it; records made after this commit do.
EMULATION_SHARING = "held"
FABRIC_SHARING = {"droptail": "held", "lossless": "maxmin"}


def sharing_of(record: dict | None) -> str:
    """The sharing that models the record's fabric (a record without one was made on droptail)."""
    return FABRIC_SHARING.get((record or {}).get("fabric") or "droptail", EMULATION_SHARING)


@dataclass(frozen=True)
class Calibration:
    efficiency: float
    step_latency_emulated_s: float
    source: str
    sharing: str = EMULATION_SHARING
    model_sharing: str = EMULATION_SHARING  # the model's for the record's fabric; `sharing` differs in a what-if

    def net(self, rack: Rack) -> NetParams:
        """The emulated rack's network in rack seconds and bytes: calibrated efficiency, latency (a small chunk's
        step its own, SMALL_STEP_S) and sharing."""
        em = rack.spec.emulation
        return NetParams(
            self.efficiency, self.step_latency_emulated_s / em.time_dilation, self.sharing,
            SMALL_STEP_S / em.time_dilation, SMALL_CHUNK_BYTES / (em.rate_scale * em.time_dilation),
        )


def efficiency_from_ring(
    fraction_of_bound: float, n: int, size_bytes: float, rate_bps: float, step_latency_s: float
) -> float:
    """The efficiency a ring measured at `fraction_of_bound` implies, its per-step latency taken out."""
    steps = 2 * (n - 1)
    bound = steps * (size_bytes / n) * 8 / rate_bps
    measured = bound / fraction_of_bound
    return bound / (measured - steps * step_latency_s)


# What a ring step costs beyond its bytes at the line rate on the emulated fabric (emulated seconds), measured by
# scripts/bench_allreduce.py (a ring of 4 under one switch, the paper cases' 528 kB gradient, no compute; the median
# of 100 all-reduces). It is not a software latency: a chunk of 132 kB crosses several shaped store-and-forward hops
# of 9 kB frames at 50 Mbit/s and waits for their first frames to arrive. The records each constant here was measured
# in, and how: evidence/calibration.py.
STEP_S = 0.00970
# A step whose chunk is small costs far less: chunks of 1-25.6 kB (emulated) 0.10-0.72 ms, chunks of 34.6-138 kB
# 3.6-13.9 ms, with no trend above (STEP_S stands for every chunk above). Chunks at or under SMALL_CHUNK_BYTES
# (emulated bytes; rack bytes x rate scale x time dilation) cost SMALL_STEP_S, the median of the records under it.
# The demo's rings (VGG16, 138-277 kB at 50 Mbit/s) are all above: its points keep STEP_S.
SMALL_STEP_S = 0.00029
SMALL_CHUNK_BYTES = 25_600
# docs/emulated-rack.md, "Fidelity of the emulated fabric": ring of 4, 16 MB at 50 Mbit/s, 91.0 % of bound (MTU 1500)
PROVISIONAL = Calibration(
    efficiency_from_ring(0.910, 4, 16e6, 50e6, STEP_S),
    STEP_S,
    f"provisional: README bench ring 91.0 % of bound (16 MB, 4 ranks, 50 Mbit/s), {1000 * STEP_S:.1f} ms per step "
    "beyond the bytes (bench_allreduce)",
)


def load_record(path: str | Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def from_record(record: dict | None) -> Calibration:
    """The calibration the demo measured and recorded, or the provisional figures when it has none."""
    runs = ((record or {}).get("calibration") or {}).get("runs") or []
    used = _rate_used(record) if runs else None
    at_rate = [r for r in runs if used is None or abs(r["rate_mbps"] - used) <= 1e-6 * used] or runs
    if not at_rate:
        return PROVISIONAL
    median = statistics.median(r["fraction"] for r in at_rate)
    return Calibration(
        median,
        STEP_S,
        f"the demo's calibration: a ring of TCP flows at {100 * median:.1f} % of the line rate (median of "
        f"{len(at_rate)} runs), and {1000 * STEP_S:.1f} ms per step beyond the bytes (bench_allreduce)",
        sharing_of(record),
        sharing_of(record),
    )


def _rate_used(record: dict) -> float | None:
    """The emulated NIC rate (Mbit/s) of the demo's runs: the rate scale it settled on x the NICs' line rate."""
    rack = record.get("rack") or {}
    try:
        nic = max(g["nic"]["rate_gbps"] for s in rack["servers"] for g in s["gpus"])
        scale = record.get("rate_scale", rack.get("emulation", {}).get("rate_scale", 0.0005))
    except (KeyError, ValueError, TypeError):
        return None
    return nic * 1000.0 * scale

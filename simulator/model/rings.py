"""One ring all-reduce job as the engines see it, and its closed forms when it is alone on its links.

An iteration is the compute phase (the slowest rank's profile time) followed by ring all-reduce:
2(n-1) steps, each moving S/n bytes on every flow rank i -> rank i+1, each as slow as its
slowest flow, plus a fixed per-step latency. Rates here are already scaled by the protocol
efficiency (`NetParams.efficiency`).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Ring:
    key: int  # the job's index
    compute_s: float  # the slowest rank's compute phase
    busy_s: float  # the mean rank's compute phase (GPU utilization = busy_s / iteration time)
    n: int
    gradient_bytes: float
    cap: float  # bytes/s: efficiency x the slowest NIC
    links: dict[int, int] = field(default_factory=dict)  # link -> flows of this ring on it
    # coarse: the all-reduce is stepped through as one phase of 2(n-1) steps, the ring keeping its
    # share of each link through its per-step latency (fine where the latency is small beside a step)
    coarse: bool = False
    # its fixed cost per ring step (rack seconds); None: the network's (`NetParams.step_latency_s`, as the
    # engines are given it). Set where the cost depends on the ring's chunk (simulator/model/calibration.py)
    latency_s: float | None = None

    @property
    def steps(self) -> int:
        return 2 * (self.n - 1)

    @property
    def step_bytes(self) -> float:
        return self.gradient_bytes / self.n


def alone_rate(ring: Ring, capacity: list[float]) -> float:
    """The ring's rate with no other traffic on its links (`capacity` already scaled by efficiency)."""
    rate = ring.cap
    for link, flows in ring.links.items():
        rate = min(rate, capacity[link] / flows)
    return rate


def latency_of(ring: Ring, default: float) -> float:
    """The ring's per-step latency: its own where set, else `default` (the network's)."""
    return default if ring.latency_s is None else ring.latency_s


def step_time(ring: Ring, rate: float, latency: float) -> float:
    return ring.step_bytes / rate + latency_of(ring, latency)


def iteration_time(ring: Ring, rate: float, latency: float) -> float:
    """Compute phase plus 2(n-1) steps at a constant `rate` (exact for a ring alone on its links)."""
    if ring.steps == 0:
        return ring.compute_s
    return ring.compute_s + ring.steps * step_time(ring, rate, latency)


def comm_bytes_per_link(ring: Ring) -> float:
    """Bytes one iteration sends over each link the ring crosses, per flow."""
    return ring.steps * ring.step_bytes

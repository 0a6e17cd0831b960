"""Port throughput from successive counter readings, with a bounded history per port."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    t: float  # wall-clock seconds of the reading
    rx_bps: float
    tx_bps: float
    rx_bytes: int
    tx_bytes: int

    def to_json(self) -> dict:
        return {"t": round(self.t, 3), "rx_bps": round(self.rx_bps), "tx_bps": round(self.tx_bps),
                "rx_bytes": self.rx_bytes, "tx_bytes": self.tx_bytes}


class PortHistory:
    """Throughput of every (datapath, port) seen, from counters read at known times."""

    def __init__(self, size: int = 600):
        self.size = size
        self._last: dict[tuple[int, int], tuple[float, int, int]] = {}
        self._history: dict[tuple[int, int], deque[Sample]] = {}

    def record(self, dpid: int, port: int, now: float, rx_bytes: int, tx_bytes: int) -> Sample | None:
        """Add a counter reading; returns the new sample, or None for the first reading or a reset."""
        key = (dpid, port)
        last = self._last.get(key)
        self._last[key] = (now, rx_bytes, tx_bytes)
        if last is None:
            return None
        t0, rx0, tx0 = last
        dt = now - t0
        if dt <= 0 or rx_bytes < rx0 or tx_bytes < tx0:  # counters reset (port re-created)
            return None
        sample = Sample(now, (rx_bytes - rx0) * 8 / dt, (tx_bytes - tx0) * 8 / dt, rx_bytes, tx_bytes)
        self._history.setdefault(key, deque(maxlen=self.size)).append(sample)
        return sample

    def history(self, dpid: int, port: int, limit: int | None = None) -> list[Sample]:
        samples = list(self._history.get((dpid, port), ()))
        return samples if limit is None else samples[-limit:]

    def latest(self, dpid: int, port: int) -> Sample | None:
        h = self._history.get((dpid, port))
        return h[-1] if h else None

    def ports(self) -> list[tuple[int, int]]:
        return sorted(self._history)

    def forget(self, dpid: int) -> None:
        """Drop the last readings of a datapath that went away (its counters restart)."""
        for key in [k for k in self._last if k[0] == dpid]:
            del self._last[key]

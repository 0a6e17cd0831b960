"""Run one workload under each policy, with one progress bar over all of them."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.core.rack import Rack
from simulator.engine import Options, Policy, Run, RunResult
from simulator.workloads import JobSpec


class Progress:
    """A one-line progress bar on stderr (a line per policy when stderr is not a terminal)."""

    def __init__(self, total: int, stream=sys.stderr, every_s: float = 0.25, clock: Callable[[], float] = time.monotonic):
        self.total, self.stream, self.every_s, self.clock = max(total, 1), stream, every_s, clock
        self.done, self.label, self.t0, self.shown = 0, "", clock(), 0.0
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def step(self, done_in_run: int, base: int) -> None:
        self.done = base + done_in_run
        now = self.clock()
        if self.tty and now - self.shown >= self.every_s:
            self.shown = now
            frac = self.done / self.total
            bar = "#" * int(30 * frac)
            self.stream.write(f"\r[{bar:<30s}] {100 * frac:5.1f} %  {self.label}  {now - self.t0:6.1f} s")
            self.stream.flush()

    def note(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 79 + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()


@dataclass
class Study:
    rack: Rack
    jobs: list[JobSpec]
    runs: dict[str, RunResult]
    wall_s: dict[str, float]


def run_all(rack: Rack, jobs: list[JobSpec], policies: list[Policy], options: Options, quiet: bool = False) -> Study:
    bar = Progress(len(jobs) * len(policies))
    runs, wall = {}, {}
    for i, policy in enumerate(policies):
        base = i * len(jobs)
        bar.label = f"policy {policy.name} ({i + 1}/{len(policies)})"
        t0 = time.monotonic()
        runs[policy.name] = Run(rack, jobs, policy, options, None if quiet else (lambda d, b=base: bar.step(d, b))).run()
        wall[policy.name] = time.monotonic() - t0
        if not quiet:
            bar.note(f"simulate: {policy.name}: {len(jobs)} jobs in {wall[policy.name]:.1f} s")
    return Study(rack, jobs, runs, wall)

"""Run one workload under each policy (in parallel processes where there are cores), with one progress bar."""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.core.rack import Rack
from simulator.inputs.workloads import JobSpec
from simulator.model import neighbours
from simulator.model.engine import Options, Policy, RunResult


class Progress:
    """A one-line progress bar on stderr (a line per policy when stderr is not a terminal)."""

    def __init__(self, total: int, stream=None, every_s: float = 0.25, clock: Callable[[], float] = time.monotonic):
        stream = stream or sys.stderr  # looked up now: it may have been replaced since import
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


_COUNTERS = None  # in worker processes: jobs finished per policy, shared with the parent


def _one(args, tick: Callable[[int], None] | None = None) -> tuple[str, RunResult, float]:
    index, rack, jobs, policy, options = args
    if tick is None and _COUNTERS is not None:
        def tick(done: int) -> None:
            _COUNTERS[index] = done

    t0 = time.monotonic()
    result = neighbours.run_class(policy)(rack, jobs, policy, options, tick).run()
    return policy.name, result, time.monotonic() - t0


def _init(counters) -> None:
    global _COUNTERS
    _COUNTERS = counters


def run_all(rack: Rack, jobs: list[JobSpec], policies: list[Policy], options: Options, quiet: bool = False,
            workers: int | None = None) -> Study:
    """Each policy's run; every run is independent and deterministic, so the order they finish in changes nothing."""
    workers = min(len(policies), workers or os.cpu_count() or 1)
    bar = Progress(len(jobs) * len(policies))
    tasks = [(i, rack, jobs, p, options) for i, p in enumerate(policies)]
    runs, wall = {}, {}

    def finished(name: str, result: RunResult, seconds: float) -> None:
        runs[name], wall[name] = result, seconds
        if not quiet:
            bar.note(f"simulate: {name}: {len(jobs)} jobs in {seconds:.1f} s")

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for task in tasks:
            bar.label = f"policy {task[3].name}"
            base = task[0] * len(jobs)
            finished(*_one(task, None if quiet else (lambda done, b=base: bar.step(done, b))))
    else:
        ctx = multiprocessing.get_context("fork")
        counters = ctx.Array("i", len(policies), lock=False)
        bar.label = f"{len(policies)} policies in {workers} processes"
        with ctx.Pool(workers, _init, (counters,)) as pool:
            pending = pool.imap_unordered(_one, tasks)
            for _ in tasks:
                while True:
                    try:
                        finished(*pending.next(timeout=0.25))
                        break
                    except multiprocessing.TimeoutError:
                        if not quiet:
                            bar.step(sum(counters), 0)
    return Study(rack, jobs, {p.name: runs[p.name] for p in policies}, {p.name: wall[p.name] for p in policies})

"""Run one workload under each policy (in parallel processes where there are cores), with one progress bar."""
from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import queue
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

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
    figures: dict[str, object] = field(default_factory=dict)  # run_all's `figures` of each run, where it was given


_COUNTERS = None  # while policies run in several processes: jobs finished per policy, shared by them
# the rack, jobs and options of the runs under way: forked workers inherit them, so a task names only its policy
# (pickled to each worker, a 100,000-job trace and a 16,384-GPU rack were a copy per process and seconds per task)
_SHARED: tuple[Rack, list[JobSpec], Options] | None = None


def _one(args, tick: Callable[[int], None] | None = None) -> tuple[str, RunResult, float]:
    index, policy = args
    assert _SHARED is not None, "run_all sets the runs' rack, jobs and options first"
    rack, jobs, options = _SHARED
    if tick is None and _COUNTERS is not None:
        def tick(done: int) -> None:
            _COUNTERS[index] = done

    t0 = time.monotonic()
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()  # what exists before the run (the rack, the trace) is not scanned again by the collector
    gc.set_threshold(50_000, 20, 100)  # a run makes few cycles: collect young objects less often
    try:
        result = neighbours.run_class(policy)(rack, jobs, policy, options, tick).run()
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
    return policy.name, result, time.monotonic() - t0


def _init(counters) -> None:
    global _COUNTERS
    _COUNTERS = counters


def _trim() -> None:
    """Hand the C heap's free memory back to the system (glibc's malloc_trim; nothing elsewhere)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _claim(claimed, count: int) -> int | None:
    """The next task no process took yet, taken; None when none is left."""
    with claimed.get_lock():
        index = claimed.value
        claimed.value += 1
    return index if index < count else None


def _work(tasks, claimed, counters, results) -> None:
    """A worker process: run the next task not taken until none is left; send each run (or why it failed) back."""
    _init(counters)
    while (index := _claim(claimed, len(tasks))) is not None:
        try:
            results.put(_one(tasks[index]))
        except Exception:  # the parent raises it, naming what failed here
            results.put(traceback.format_exc())
            return


def run_all(rack: Rack, jobs: list[JobSpec], policies: list[Policy], options: Options, quiet: bool = False,
            workers: int | None = None,
            figures: Callable[[Study, str], object] | None = None) -> Study:
    """Each policy's run; every run is independent and deterministic, so the order they finish in changes nothing.
    `figures(study, name)`: what a run gives (its figures), kept in Study.figures, computed in this process as soon as
    it holds the run and runs no policy: while a worker still runs its last, not after it (it reads `study.runs[name]`
    and `study.wall_s[name]`, and the rack and jobs)."""
    workers = min(len(policies), workers or os.cpu_count() or 1)
    bar = Progress(len(jobs) * len(policies))
    tasks = [(i, p) for i, p in enumerate(policies)]
    runs, wall = {}, {}
    global _SHARED
    _SHARED = (rack, jobs, options)
    study = Study(rack, jobs, runs, wall)
    idle = False  # this process runs no more policies: a run's figures are made at once

    def finished(name: str, result: RunResult, seconds: float) -> None:
        runs[name], wall[name] = result, seconds
        if not quiet:
            bar.note(f"simulate: {name}: {len(jobs)} jobs in {seconds:.1f} s")
        if idle:
            figure(name)

    def figure(name: str) -> None:
        if figures is not None and name not in study.figures:
            study.figures[name] = figures(study, name)

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for task in tasks:
            bar.label = f"policy {task[1].name}"
            base = task[0] * len(jobs)
            finished(*_one(task, None if quiet else (lambda done, b=base: bar.step(done, b))))
        idle = True
    else:
        # this process runs policies too, beside workers-1 forked ones, each taking the next policy no one took:
        # one process fewer holding the rack and the trace, and this one's runs are never pickled. The workers are
        # forked before any run (none holds another's results) and each ends once no policy is left to take.
        ctx = multiprocessing.get_context("fork")
        counters = ctx.Array("i", len(policies), lock=False)
        claimed = ctx.Value("i", 0)
        results = ctx.Queue()
        bar.label = f"{len(policies)} policies in {workers} processes"
        procs = [ctx.Process(target=_work, args=(tasks, claimed, counters, results), daemon=True)
                 for _ in range(workers - 1)]
        for proc in procs:
            proc.start()
        try:
            _init(counters)
            # the workers take the first policies (the default's first, fixed, runs longest): this process then runs
            # the shorter share and is the one idle at the end, making the figures of the runs done and taking the
            # workers' runs while their last one runs
            started = time.monotonic()
            while claimed.value < len(procs) and time.monotonic() - started < 10 and \
                    all(proc.is_alive() for proc in procs):
                time.sleep(0.002)
            while (index := _claim(claimed, len(tasks))) is not None:
                def tick(done: int, i: int = index) -> None:
                    counters[i] = done
                    bar.step(sum(counters), 0)

                finished(*_one(tasks[index], None if quiet else tick))
            _trim()  # what this process's own runs freed goes back to the system before the workers' runs come
            idle = True
            for name in list(runs):
                figure(name)
            while len(runs) < len(tasks):  # what the workers ran
                try:
                    outcome = results.get(timeout=0.25)
                except queue.Empty:
                    if not quiet:
                        bar.step(sum(counters), 0)
                    if not any(proc.is_alive() for proc in procs) and results.empty():
                        raise RuntimeError("simulate: a worker process ended without its policy's run "
                                           "(killed, out of memory?)") from None
                    continue
                if isinstance(outcome, str):
                    raise RuntimeError(f"simulate: a policy's run failed in its worker process:\n{outcome}")
                finished(*outcome)
        finally:
            global _COUNTERS
            _COUNTERS = None
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.terminate()
    for p in policies:
        figure(p.name)
    study.runs = {p.name: runs[p.name] for p in policies}  # in the policies' order
    study.wall_s = {p.name: wall[p.name] for p in policies}
    study.figures = {p.name: study.figures[p.name] for p in policies if p.name in study.figures}
    return study

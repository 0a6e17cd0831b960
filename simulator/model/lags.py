"""What a job spends on the emulated rack besides its iterations: the controller's and the containers' lags.

The replay of a trace (scripts/replay_trace.py) shows, per job, in rack seconds (`python -m
evidence.tracefit` measures each from the committed records):
- containers: GPUs granted to the job's containers started (the controller's `started_at`, the start the trace
  check compares): longer by a fraction of a second for each GPU (a container each);
- start: containers started to the first iteration: torch's import and the ring's rendezvous in each container
  (every rank's first iteration begins within milliseconds of the others'): work on the host's two cores, so
  longer for each GPU placed at the same instant (their containers start together) and for each GPU of another
  job iterating (its worker shares the cores);
- end: the last iteration's end to the job's end (`ended_at`): the ranks' exit and the controller seeing it;
- release: a job's end to its GPUs free again (its containers removed), when a queued job may be placed;
- iteration: each iteration's cost beyond its compute and all-reduce on the trace rack's loaded host (up to
  16 workers on two cores): waking from the emulated compute's sleep, filling and checking the gradient.
None of these is the rack's: they are the emulation's, as STEP_S (simulator/model/calibration.py) is. The simulator
charges them only where it is set against a replay (evidence/tracecheck.py); `Options.lags` defaults to none,
so every other run (the demo's points, the sweeps, the CLI) predicts what it predicted before.

The constants are emulated seconds (wall clock on the emulating host), as measured; `for_rack` turns them into
rack seconds by the rack's time dilation. All were chosen on the two replay records of the model before
(the replays `20261126T212055Z-a3efd36` and `20261126T220734Z-1e191d8`, every policy; this worker and
controller) and the three `make demo` records of 2026-11-26 15:46-16:12 (tuning data: none of them checks this
model; replay records made after its commit do); tests/unit/test_tracefit.py ties each to what `python -m
evidence.tracefit` prints for those records.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lags:
    """Rack seconds (see the module docstring); all zero: none."""
    containers_s: float = 0.0  # GPUs granted to its containers started
    containers_per_gpu_s: float = 0.0  # and for each GPU of the job
    start_s: float = 0.0  # containers started to the first iteration
    start_per_gpu_s: float = 0.0  # and for each GPU placed at the same instant (its own and those placed before it)
    start_per_busy_gpu_s: float = 0.0  # and for each GPU iterating on the rack as it is placed (the host's cores)
    end_s: float = 0.0
    release_s: float = 0.0
    iteration_s: float = 0.0

    def containers(self, gpus: int) -> float:
        """GPUs granted to the containers of a job of `gpus` GPUs started."""
        return self.containers_s + self.containers_per_gpu_s * gpus

    def start_delay(self, gpus_placed_now: int, gpus_iterating: int = 0) -> float:
        """Containers started to the first iteration, for a job placed with `gpus_placed_now` GPUs (its own among
        them) placed at the same instant and `gpus_iterating` GPUs of other jobs iterating."""
        return self.start_s + self.start_per_gpu_s * gpus_placed_now + self.start_per_busy_gpu_s * gpus_iterating


NONE = Lags()

# Emulated seconds, as `python -m evidence.tracefit` prints them for the records named above (every policy of both
# replays pooled):
# containers: the slope of started_at on the job's GPUs among jobs placed at one instant (the replays' queue drains,
# least squares within each drain), and the median of submit to started_at less that slope's part over the jobs
# placed at once (the replays' jobs with GPUs free and no end before them, the demo records' twelve detailed jobs)
CONTAINERS_S = 1.170
CONTAINERS_PER_GPU_S = 0.127
# containers started to the first iteration: the host's two cores shared by the containers starting and the workers
# iterating, so no fixed part: least squares through the origin over the replays' 240 jobs against the GPUs placed at
# their instant up to and including their own, and the GPUs of other jobs iterating as they were admitted. (The
# model before, 8.826 s + 0.239 s per GPU placed at the instant, charged a lone job on an idle host about 2.5 times
# the start it had, and such a job's end decides where the next jobs go.)
START_S = 0.0
START_PER_GPU_S = 0.832
START_PER_BUSY_GPU_S = 0.212
# the latest rank's last iteration's end to ended_at: median of the demo records' twelve detailed jobs
END_S = 0.698
# ended_at of the latest job to end before a queued job's start to that start, less the containers' part: median
# over the replays' jobs that waited
RELEASE_S = 0.601
# per iteration beyond the profile's compute: median of the replays' 1-GPU jobs (no all-reduce), (end - first
# iteration - END_S) / iterations - compute
ITERATION_S = 0.006


def for_rack(dilation: float) -> Lags:
    """The emulation's lags in rack seconds for a rack emulated `dilation` times slower."""
    return Lags(CONTAINERS_S / dilation, CONTAINERS_PER_GPU_S / dilation, START_S / dilation,
                START_PER_GPU_S / dilation, START_PER_BUSY_GPU_S / dilation, END_S / dilation, RELEASE_S / dilation,
                ITERATION_S / dilation)

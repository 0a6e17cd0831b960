"""What a job spends on the emulated rack besides its iterations: the controller's and the containers' lags.

The replay of a trace (scripts/replay_trace.py) shows, per job, in rack seconds (issue 35; `python -m
simulator.tracefit` measures each from the committed records):
- admit: submit to start (GPUs granted) with GPUs free: the controller's admission, its REST round trips;
- start: start to the first iteration: the containers' start on their engines, torch's import, the ring's
  rendezvous; longer when several jobs' containers start at one instant (they share the host's two cores);
- end: the last iteration's end to the job's end (`ended_at`): the ranks' exit and the controller seeing it;
- release: a job's end to the next queued job's start: the containers' removal before the GPUs are free again;
- iteration: each iteration's cost beyond its compute and all-reduce on the trace rack's loaded host (up to
  16 workers on two cores): waking from the emulated compute's sleep, filling and checking the gradient.
None of these is the rack's: they are the emulation's, as STEP_S (simulator/calibration.py) is. The simulator
charges them only where it is set against a replay (simulator/tracecheck.py); `Options.lags` defaults to none,
so every other run (the demo's points, the sweeps, the CLI) is as before.

The constants are emulated seconds (wall clock on the emulating host), as measured; a rack's `for_rack` turns
them into rack seconds by its time dilation. Where each comes from is beside it; all were chosen on the one
fixed-policy replay record `results/replay/20261126T145924Z-226abd5.json` and the three `make demo` records of
2026-11-26 15:46-16:12 (tuning data: none of them checks this model; replay records made after its commit do).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lags:
    """Rack seconds (see the module docstring); all zero: none."""
    admit_s: float = 0.0
    start_s: float = 0.0  # start to first iteration, a job alone
    start_per_gpu_s: float = 0.0  # and for each GPU placed at the same instant (its own included)
    end_s: float = 0.0
    release_s: float = 0.0
    iteration_s: float = 0.0

    def start_delay(self, gpus_placed_now: int) -> float:
        """Start to first iteration of a job placed with `gpus_placed_now` GPUs (its own among them) placed at the
        same instant."""
        return self.start_s + self.start_per_gpu_s * gpus_placed_now


NONE = Lags()

# Emulated seconds, each the median (or least-squares fit) that `python -m simulator.tracefit` prints:
# submit to start, a job placed at once: the replay's three jobs that found GPUs free and the demo's six jobs with
# a detailed log (runs[i].job: created_at to started_at)
ADMIT_S = 1.66
# start to first iteration: least squares over the replay's 40 jobs, delay = a + b x GPUs placed at the same instant
START_S = 5.68
START_PER_GPU_S = 0.64
# last iteration's end (the latest rank's) to ended_at: the demo's six detailed jobs (runs[i].job.ranks)
END_S = 0.75
# ended_at to the next queued job's start (started_at), over the replay's jobs that waited for GPUs
RELEASE_S = 2.74
# per iteration beyond the profile's compute: the replay's eight 1-GPU jobs (no all-reduce), (end - first
# iteration - END_S) / iterations - compute
ITERATION_S = 0.032


def for_rack(dilation: float) -> Lags:
    """The emulation's lags in rack seconds for a rack emulated `dilation` times slower."""
    return Lags(ADMIT_S / dilation, START_S / dilation, START_PER_GPU_S / dilation, END_S / dilation,
                RELEASE_S / dilation, ITERATION_S / dilation)

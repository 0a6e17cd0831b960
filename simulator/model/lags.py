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

The constants are emulated seconds on the fit's host (wall clock on the emulating host, as measured), and the host
changes from day to day (its starts were about twice as fast on 2026-12-06 as on 2026-11-29): every replay runs the
host's probe (scripts/replay_trace.py's PROBE: two jobs, each alone on the idle testbed, before each policy's
trace), and a replay's host factor (`host_factor`) is its probe over PROBE_S, the probe on the fit's host. `for_rack`
turns the constants into rack seconds for a rack emulated `dilation` times slower, on a host `host` times slower than
the fit's. All were fitted on the fit set of docs/trace-model.md's rule (evidence/tracefit.py's REPLAYS: every
replay with the probe of trace16.csv and trace16-small.csv made from the main line on 2026-12-06 before the
freeze), each replay's seconds divided by its factor; tests/unit/test_tracefit.py ties each to what `python -m
evidence.tracefit` prints for those records.

The lags vary from job to job well beyond what the load explains (each job's measured start lag over the least
squares' is 0.37-1.82 between its 5th and 95th percentiles on the fit set), and on a 16-GPU rack a second decides which
GPUs a later job finds free. So the trace check predicts the mean over DRAWS runs, each job's two start lags times a
factor drawn from that spread (`draws`: log-normal, its log's standard deviation and correlation measured on the fit
set as the constants are): each job's expected completion, not one of the ways the queue can go.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Lags:
    """Rack seconds (see the module docstring); all zero: none."""
    containers_s: float = 0.0  # GPUs granted to its containers started
    containers_per_gpu_s: float = 0.0  # and for each GPU starting as it is placed (its own and other jobs' not yet
    # at their first iteration)
    containers_per_busy_gpu_s: float = 0.0  # and for each GPU iterating on the rack as it is placed
    start_s: float = 0.0  # containers started to the first iteration
    start_per_gpu_s: float = 0.0  # and for each GPU starting as it is placed (as containers_per_gpu_s)
    start_per_busy_gpu_s: float = 0.0  # and for each GPU iterating on the rack as it is placed (the host's cores)
    end_s: float = 0.0
    release_s: float = 0.0
    iteration_s: float = 0.0
    iteration_per_gb_s: float = 0.0  # and for each GB of the job's gradient (filled and checked at every iteration)

    def containers(self, gpus_starting: int, gpus_iterating: int = 0) -> float:
        """GPUs granted to the containers of a job started, the job placed with `gpus_starting` GPUs starting (its
        own and those of jobs placed before it not yet at their first iteration: their containers and torch's import
        share the host's cores) and `gpus_iterating` GPUs of other jobs iterating."""
        return self.containers_s + self.containers_per_gpu_s * gpus_starting \
            + self.containers_per_busy_gpu_s * gpus_iterating

    def start_delay(self, gpus_starting: int, gpus_iterating: int = 0) -> float:
        """Containers started to the first iteration, for a job placed with `gpus_starting` GPUs starting (as
        `containers`) and `gpus_iterating` GPUs of other jobs iterating."""
        return self.start_s + self.start_per_gpu_s * gpus_starting + self.start_per_busy_gpu_s * gpus_iterating

    def iteration(self, gradient_bytes: float) -> float:
        """Each iteration's cost beyond its compute for a job whose gradient is `gradient_bytes`."""
        return self.iteration_s + self.iteration_per_gb_s * gradient_bytes / 1e9


NONE = Lags()

# Emulated seconds on the fit's host, as `python -m evidence.tracefit` prints them for the fit set
# (evidence/tracefit.py's REPLAYS: four replays, 12 policy runs, 420 jobs; each replay's seconds over its host factor):
# the host's probe: the median over the fit's 12 policy runs (3.90-5.16 s)
PROBE_S = 4.141
# GPUs granted to containers started: least squares over every job on the GPUs starting as it is admitted (its own and
# those of jobs admitted before it not yet at their first iteration) and the GPUs of other jobs iterating
CONTAINERS_S = 0.699
CONTAINERS_PER_GPU_S = 0.209
CONTAINERS_PER_BUSY_GPU_S = 0.105
# containers started to the first iteration: the same least squares (torch's import and the ring's rendezvous share
# the host's two cores with the other jobs starting and iterating)
START_S = 1.872
START_PER_GPU_S = 0.613
START_PER_BUSY_GPU_S = 0.256
# the 1-GPU jobs (no all-reduce): their first iteration to ended_at less the profile's compute, a line on iterations x
# the gradient's GB: the intercept is the end (the ranks' exit, the controller seeing it), the slope each iteration's
# cost per GB of gradient (filling and checking it; VGG16's 0.53 GB against ResNet-50's 0.10 GB); no part per
# iteration beyond it (the line with one fits no better: -0.0008 s)
END_S = 0.881
ITERATION_S = 0.0
ITERATION_PER_GB_S = 0.072
# ended_at of the latest job to end before a queued job's start to that start, less the containers' part: its median
# over the 364 jobs that waited is -0.110 s, below zero (the containers' line charges them more than they took), so
# none: GPUs are not free before the job's end
RELEASE_S = 0.0


# The emulation's spread around the two start lags: each job's measured lag over the least squares' (the fit set's
# 420 jobs), a log-normal factor of mean one; its log's standard deviation for the containers' lag and the start
# lag, and the correlation of the two logs (a job slow to start its containers is often slow to its first iteration)
CONTAINERS_LOG_SD = 0.342
START_LOG_SD = 0.475
LOG_CORRELATION = 0.348
# the trace check's prediction is the mean over this many draws of those factors (tracesim.simulate): on a 16-GPU
# rack a second's lag decides which GPUs a later job finds free, so one run predicts one of the ways the queue can go;
# the mean over draws predicts each job's expected completion (64: the fit set's in-sample figures moved by up to
# 2 pp between 16 and 64 draws and by under 1 pp between 64 and 128)
DRAWS = 64


def draws(jobs: int, count: int | None = None) -> list[tuple[tuple[float, float], ...]]:
    """`count` draws, each per job (trace order) its containers' and start lags' factors (log-normal, mean one, the
    spread and correlation above); the same for the same arguments (draw i from seed i)."""
    import numpy as np

    out = []
    rho = LOG_CORRELATION
    for i in range(DRAWS if count is None else count):
        z = np.random.default_rng(i).standard_normal((jobs, 2))
        zc, zs = z[:, 0], rho * z[:, 0] + (1 - rho * rho) ** 0.5 * z[:, 1]
        c = np.exp(CONTAINERS_LOG_SD * zc - CONTAINERS_LOG_SD ** 2 / 2)
        s = np.exp(START_LOG_SD * zs - START_LOG_SD ** 2 / 2)
        out.append(tuple((float(a), float(b)) for a, b in zip(c, s, strict=True)))
    return out


def probe_seconds(run: dict, dilation: float) -> float | None:
    """A replay's policy run's host's probe (scripts/replay_trace.py's PROBE, the run's `probe` rows, rack s): each
    probe job's GPUs granted to its first iteration, summed over the probe's jobs, in emulated seconds; None where the
    run has no probe (records made before it, or with --no-probe)."""
    rows = run.get("probe") or []
    if not rows or any(r.get("admit_s") is None or r.get("first_iteration_s") is None for r in rows):
        return None
    return dilation * sum(r["first_iteration_s"] - r["admit_s"] for r in rows)


def host_factor(record: dict) -> float | None:
    """How much slower than the fit's host the host of a replay record was: the median over its policy runs of the
    probe's seconds (probe_seconds), over PROBE_S. None where no run has a probe: the model in the host's units
    neither fits on nor judges such a record."""
    d = record.get("time_dilation", 1.0)
    seconds = [x for x in (probe_seconds(run, d) for run in record["policies"].values()) if x is not None]
    return statistics.median(seconds) / PROBE_S if seconds else None


def for_rack(dilation: float, host: float = 1.0) -> Lags:
    """The emulation's lags in rack seconds for a rack emulated `dilation` times slower on a host `host` times
    slower than the fit's (host_factor): every lag is the host's work, so each is charged `host` times."""
    k = host / dilation
    return Lags(containers_s=CONTAINERS_S * k, containers_per_gpu_s=CONTAINERS_PER_GPU_S * k,
                containers_per_busy_gpu_s=CONTAINERS_PER_BUSY_GPU_S * k, start_s=START_S * k,
                start_per_gpu_s=START_PER_GPU_S * k, start_per_busy_gpu_s=START_PER_BUSY_GPU_S * k, end_s=END_S * k,
                release_s=RELEASE_S * k, iteration_s=ITERATION_S * k, iteration_per_gb_s=ITERATION_PER_GB_S * k)

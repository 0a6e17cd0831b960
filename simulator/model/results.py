"""What a simulated run predicts: each job's times, placement, moves and losses, and the run's GPUs held, computing
and circuit changes (simulator/studies/metrics.py turns them into figures)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter

from simulator.model.busy import Rows
from simulator.model.runspec import Policy


@dataclass(slots=True)
class JobResult:
    id: str
    gpus: int
    model: str
    iterations: int
    arrival_s: float
    placed_s: float = -1.0  # GPUs granted
    started_s: float = -1.0  # its containers started (placed_s plus Lags.containers; the controller's started_at)
    start_s: float = -1.0  # first iteration
    end_s: float = -1.0
    placement: tuple[str, ...] = ()
    switches: int = 0
    shift_s: float = 0.0
    score_before: float = 0.0  # summed compatibility score of its shared links, unshifted (time shifting)
    score_after: float = 0.0  # and with the chosen shift
    stall_s: float = 0.0  # dark time after the start (moves)
    moves: int = 0
    shared: bool = False
    alone_iteration_s: float = 0.0  # where it was first placed, with no other traffic
    label: str = ""
    stopped: bool = False  # stopped with the job it ran beside
    done: float = 0.0  # iterations done (all of them, unless stopped)
    failed: str = ""  # why the controller gave up on it (it could never be placed)
    alone_run_s: float = 0.0  # a replayed job's recorded duration (else iterations x alone_iteration_s)
    preemptions: int = 0  # times the scheduler stopped it to run another (las)
    interruptions: int = 0  # times a server it held failed
    redone: float = 0.0  # iterations lost at interruptions (done again)
    suspended_s: float = 0.0  # time between a preemption and its restart
    end_lag_s: float = 0.0  # its last iteration's end to its end (Lags.end_s)

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        return self.placed_s - self.arrival_s

    @property
    def mean_iteration_s(self) -> float:
        run = self.end_s - self.end_lag_s - self.start_s - self.stall_s - self.suspended_s
        return run / self.done if self.done else float("nan")

    def __reduce__(self):
        """Pickled as its fields' values in their order, made again by its constructor: a run's 100,000 jobs come back
        from a policy's worker process (simulator/studies/study.py) in a third of the time the dataclass's own state
        of a slotted class (a list built field by field, each set again by name) takes."""
        return JobResult, _VALUES(self)


_VALUES = attrgetter(*(f.name for f in fields(JobResult)))  # every field's value, in the constructor's order


@dataclass
class RunResult:
    policy: Policy
    jobs: list[JobResult]
    held: list[tuple[float, float, int]] | Rows  # from, to, GPUs held
    busy: object  # (from, to, GPU-seconds computed) pieces: a list, or Busy
    reconfigurations: int = 0
    circuits_changed: int = 0
    dark_s: float = 0.0  # summed dark windows
    stats: dict = field(default_factory=dict)
    frag: list[tuple[float, int, int]] | Rows = field(default_factory=list)  # time, most free under a switch, free
    failures: int = 0  # server failures (while the server was up)
    lost_gpu_s: float = 0.0  # GPU-seconds of work lost at interruptions
    restart_gpu_s: float = 0.0  # GPU-seconds held while restarting after an interruption

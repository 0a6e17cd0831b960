"""Server failures in a simulated run, the three ways a job recovers, and goodput.

Failures: a Poisson process over the servers, each failing at `1 / mtbf` (per server); a failure takes its server
down for `repair_s`, and every job holding one of its GPUs is interrupted. The default rate is Llama 3's report
("The Llama 3 Herd of Models", 2024, section 3.3.4): 419 unexpected interruptions in a 54-day snapshot of training on
16,384 H100 GPUs, that is 2,048 servers of 8, so one failure per server every 2,048 x 54 x 24 / 419 = 6,334.6 hours.
The report gives no repair time; `REPAIR_H` is an assumption.

Recovery (`Failures.recovery`):
- `swap`: spare GPUs are circuited in through the OCS and every rank restarts from the last checkpoint:
  the job is placed again at once, at the head of the queue, by the same rules as a new job, and iterates again
  `swap_s` after the failure at the earliest. `SWAP_S` is the failover benchmark's measured median from a server's
  kill to every rank iterating again, 0.60 s over 20 rounds on the emulated rack with survivors kept in their
  processes and a warm spare (`python scripts/bench_failover.py --rounds 20`; tests/unit/test_sim_failures.py checks
  the constant equals its committed record's median to 10 ms; a restart of every rank, before survivors were kept,
  took 3.57 s); the recovery papers report about 1-1.2 s. With no room, it waits at the head.
- `checkpoint`: the job waits for its server's repair, then goes to the head of the queue and restarts from the
  last checkpoint, `restart_s` after it is placed again.
- `scratch`: the job goes to the head of the queue at once and restarts from its first iteration, `restart_s` after
  it is placed again (a job that failed and was submitted again).
Checkpoints: every `checkpoint_s` seconds of a job's running since it last started; what it did since its last
checkpoint is lost (the progress at the checkpoint is interpolated over the run since it started).

Goodput: useful GPU-seconds over GPU-seconds held, where what is not useful is the GPU-seconds of work lost at
interruptions (from the last checkpoint to the failure, or from the start under `scratch`) and the GPU-seconds held
while restarting (from being placed again to iterating again).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_SERVERS = 16_384 // 8
MTBF_H = LLAMA3_SERVERS * LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS  # 6,334.6 h per server
REPAIR_H = 4.0  # assumed: the report gives no repair time
# the failover benchmark's median, kill to all ranks iterating, a server killed (20 rounds; module docstring)
SWAP_S = 0.60
RESTART_S = 60.0  # assumed: a job's containers started again and its checkpoint loaded
CHECKPOINT_S = 600.0  # assumed: a checkpoint every ten minutes of running
RECOVERIES = {
    "swap": "spare GPUs swapped in through the OCS, restart from the last checkpoint",
    "checkpoint": "restart from the last checkpoint after the server's repair",
    "scratch": "restart from the first iteration",
}


@dataclass(frozen=True)
class Failures:
    recovery: str = "swap"
    mtbf_s: float = MTBF_H * 3600
    repair_s: float = REPAIR_H * 3600
    swap_s: float = SWAP_S
    restart_s: float = RESTART_S
    checkpoint_s: float = CHECKPOINT_S
    seed: int = 1

    def check(self) -> None:
        if self.recovery not in RECOVERIES:
            raise ValueError(f"--failures: unknown recovery {self.recovery!r} (known: none, {', '.join(RECOVERIES)})")
        for name, value in (("--server-mtbf-h", self.mtbf_s), ("--checkpoint-s", self.checkpoint_s)):
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be positive, not {value:g}")
        for name, value in (("--repair-h", self.repair_s), ("--swap-s", self.swap_s),
                            ("--restart-s", self.restart_s)):
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be 0 or more, not {value:g}")

    def describe(self) -> str:
        return (f"server failures: one per server every {self.mtbf_s / 3600:,.1f} h on average (Poisson), repaired "
                f"in {self.repair_s / 3600:g} h; recovery: {RECOVERIES[self.recovery]} (swap {self.swap_s:g} s, "
                f"restart {self.restart_s:g} s, a checkpoint every {self.checkpoint_s:g} s of running)")


class FailureClock:
    """The failures of one run: when the next comes and which server, from its own seeded generator (so the same
    seed gives the same failures whatever the workload draws)."""

    def __init__(self, f: Failures, servers: list[str]):
        self.f, self.servers = f, servers
        self.rng = random.Random(f"optirack-failures:{f.seed}")
        self.rate = len(servers) / f.mtbf_s

    def next(self, t: float) -> tuple[float, str]:
        return t + self.rng.expovariate(self.rate), self.servers[self.rng.randrange(len(self.servers))]


def checkpointed(progress: float, since_progress: float, since_t: float, t: float, every_s: float) -> float:
    """Whole iterations saved by the last checkpoint before `t`, for a job that started at `since_t` with
    `since_progress` iterations done and has `progress` now (checkpoints every `every_s` s of running)."""
    if t <= since_t:
        return math.floor(since_progress + 1e-9)
    last = since_t + math.floor((t - since_t) / every_s) * every_s
    at = since_progress + (progress - since_progress) * (last - since_t) / (t - since_t)
    return float(max(math.floor(since_progress + 1e-9), math.floor(at + 1e-9)))


def last_checkpoint_t(since_t: float, t: float, every_s: float) -> float:
    return since_t + math.floor(max(0.0, t - since_t) / every_s) * every_s

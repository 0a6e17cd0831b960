"""A simulated run as the admission policies see it (controller.core.admission.Cluster): free GPUs, each job's size,
its time left and the service it attained, and preemption."""
from __future__ import annotations

from controller.core import admission
from simulator.model import models
from simulator.model.network import GBPS


class SchedulerView:
    """The simulated cluster as the admission policies see it (controller.core.admission.Cluster)."""

    def __init__(self, run):
        self.run, self.now = run, 0.0
        self._per: dict[tuple[str, int], float] = {}
        gpus = list(run.rack.gpus.values())
        names = [g.model for g in gpus]
        self._common = max(sorted(set(names)), key=names.count)
        self._nic = min(g.nic.rate_gbps for g in gpus) * GBPS

    def free(self) -> int:
        return self.run.placer.free()

    def gpus(self, key: int) -> int:
        return self.run.jobs[key].gpus

    def _iteration(self, model: str, n: int) -> float:
        """A job's iteration alone on the rack's commonest GPU model, its all-reduce at the NICs' rate."""
        if (model, n) not in self._per:
            run = self.run
            c = models.cost(model, [self._common] * n, run.server_gpus, run.o.nvlink_gbps * GBPS, self._nic)
            steps = 2 * (n - 1)
            comm = steps * (c.gradient_bytes / n / (self._nic * run.o.net.efficiency)
                            + run.o.net.step_latency(c.gradient_bytes / n))
            self._per[model, n] = max(c.compute_s) + comm
        return self._per[model, n]

    def _length(self, key: int) -> float:
        run, job = self.run, self.run.jobs[key]
        if job.duration_s and not job.iterations:
            return job.duration_s
        r = run.results[key]
        per = r.alone_iteration_s or self._iteration(job.model, job.gpus)
        return run.iterations[key] * per

    def estimate(self, key: int) -> float:
        """Seconds left to run: a running ring's predicted end, else its length alone less the whole iterations
        done before a preemption."""
        run = self.run
        if key in run.releasing:
            return max(0.0, run.releasing[key] - self.now)
        if key in run.running and key not in run.replayed and key in run.inter.finish:
            return max(0.0, run.inter.finish[key] - self.now)
        length = self._length(key)
        state = run.resume.get(key)
        if state is not None and run.iterations[key]:
            length *= max(0.0, 1 - state.done / run.iterations[key])
        if key in run.pending:
            return run.pending[key][1] - self.now + length
        if key in run.replayed and key in run.running:
            return max(0.0, run.results[key].start_s + run.jobs[key].duration_s - self.now)
        return length

    def attained(self, key: int) -> float:
        run = self.run
        since = run.since.get(key)
        held = (self.now - since) * run.jobs[key].gpus if since is not None else 0.0
        return run.served.get(key, 0.0) + held

    def running(self) -> list[admission.Running]:
        run = self.run
        keys = sorted(run.running | set(run.pending) | run.moving | set(run.releasing))
        return [admission.Running(k, run.jobs[k].gpus, self.now + self.estimate(k), self.attained(k),
                                  k not in run.moving and k not in run.replayed and k not in run.releasing)
                for k in keys]

    def preempt(self, key: int) -> None:
        self.run.preempt(self.now, key)

"""A simulated run's server failures: a server fails, the jobs on it are interrupted and recover (swap, checkpoint or
scratch, simulator/model/failures.py), the server is repaired. A part of simulator/model/engine.py's Run."""
from __future__ import annotations

from simulator.model.detail import RingState
from simulator.model.eventkinds import FAIL, REPAIR, REQUEUE
from simulator.model.failures import checkpointed


class FailureEvents:
    """Run's handlers of failures and repairs (Run holds the state they read and change)."""

    def _next_failure(self, t: float) -> None:
        when, server = self.clock.next(t)
        if when < float("inf"):
            self.push(when, FAIL, -1, server)

    def _work_left(self) -> bool:
        return bool(self.arrived < len(self.jobs) or self.running or self.pending or self.moving or self.queue
                    or self.requeued or self.releasing)

    def _server_fails(self, t: float, _, server: str) -> None:
        """A server fails: every job holding one of its GPUs is interrupted, and its GPUs are out until repaired."""
        if self._work_left():
            self._next_failure(t)
        if server in self.down:
            return
        self.out.failures += 1
        occ = self.placer.occ
        holders = {occ.holder[occ.ix.gpu_id[g]] for g in self.servers[server]} - {None}
        holders -= {self.jobs[k].id for k in self.releasing}  # ended: only their release is left
        for key in sorted(self.key_of[j] for j in holders):
            self._interrupt(t, key)
        f = self.o.failures
        self.down[server] = t + f.repair_s
        self.placer.hold(f"down:{server}", self.servers[server])
        self.push(t + f.repair_s, REPAIR, -1, server)
        self._admit(t)

    def _interrupt(self, t: float, key: int) -> None:
        f, r = self.o.failures, self.results[key]
        was_running = key in self.running or key in self.moving
        held = self.placer.gpus[self.jobs[key].id]
        switches = self.placer.switches(held)
        progress = self._stop(t, key)
        since_t, since_p = self.run_since.pop(key, (t, progress))
        if f.recovery == "scratch":
            keep = 0.0
        else:
            keep = checkpointed(progress, since_p, since_t, t, f.checkpoint_s) if was_running else progress
        lost = max(0.0, progress - keep)
        if lost and progress > since_p:  # the lost iterations at the pace of this run
            self.out.lost_gpu_s += lost * (t - since_t) / (progress - since_p) * r.gpus
        r.interruptions += 1
        r.redone += lost
        self.resume[key] = RingState(done=int(keep))
        if f.recovery == "swap":
            self.swapping[key] = (held, switches)
            self.delay[key] = (t + f.swap_s, 0.0)
            self.queue.appendleft(key)
        elif f.recovery == "scratch":
            self.delay[key] = (0.0, f.restart_s)
            self.queue.appendleft(key)
        else:  # after the repair
            self.delay[key] = (0.0, f.restart_s)
            self.requeued += 1
            self.push(t + f.repair_s, REQUEUE, key)

    def _repaired(self, t: float, _, server: str) -> None:
        del self.down[server]
        self.placer.release(f"down:{server}")
        self._admit(t)

    def _requeue(self, t: float, key: int, _) -> None:
        self.requeued -= 1
        self.queue.appendleft(key)
        self._admit(t)

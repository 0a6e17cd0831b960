"""A simulated run's defragmentation: every `defrag_s` the controller's joint regrouping moves running jobs; a moved
job's circuits go dark, it stalls, then goes on where it was. A part of simulator/model/engine.py's Run."""
from __future__ import annotations

from simulator.model.eventkinds import DEFRAG, MOVE, RESUME


class Moves:
    """Run's handlers of defragmentation rounds and of the moves they make."""

    def _defragment(self, t: float, *_) -> None:
        running = {self.jobs[k].id: self.placer.gpus[self.jobs[k].id] for k in self.running
                   if k not in self.moving and k not in self.replayed}
        for step in self.placer.defragment(running):
            begin = max(t, self.ocs_free)
            ready = self._reconfigure(t, step.diff)
            for job, p in step.moves.items():
                key = self.key_of[job]
                self.moving.add(key)
                self.results[key].switches = len(p.switches)
                self.push(begin, MOVE, key, (ready, self.gen.get(key, 0)))
        if self.running or self.queue or self.arrived < len(self.jobs):
            self.push(t + self.policy.defrag_s, DEFRAG)

    def _move(self, t: float, key: int, data: tuple[float, int]) -> None:
        """A moved job's circuits go dark: it stalls until `ready`, then goes on where it was."""
        ready, gen = data
        if key not in self.running or gen != self.gen.get(key, 0):  # it ended (or was stopped) before its turn
            if gen == self.gen.get(key, 0):
                self.moving.discard(key)
            return
        state, _ = self.inter.remove(t, key)
        self.running.discard(key)
        r = self.results[key]
        r.moves, r.stall_s = r.moves + 1, r.stall_s + (ready - t)
        self.stalled[key] = state
        self.push(ready, RESUME, key, gen)

    def _resume(self, t: float, key: int, gen: int) -> None:
        if gen != self.gen.get(key, 0) or key not in self.stalled:  # interrupted while it stalled
            return
        state = self.stalled.pop(key)
        self.moving.discard(key)
        self.running.add(key)
        self.inter.add(t, self._ring(key), self.iterations[key], state)

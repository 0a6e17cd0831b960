"""One simulated run: a workload on a rack under one policy, from the first arrival to the last job's end.

Events: arrivals, a job's first iteration (after its circuits are set and any time shift),
a ring's last iteration (from simulator/model/interference.py), defragmentation rounds, and the start
and end of a moved job's stall. Placement goes through simulator/model/adapter.py, so every decision
is the controller's own; jobs that cannot be placed wait, first come first served.
"""
from __future__ import annotations

import bisect
import heapq
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from controller.core import admission, spares
from controller.core.circuits import CircuitDiff
from controller.core.placement import NoRoomNow
from controller.core.rack import Rack
from simulator.inputs.workloads import JobSpec
from simulator.model import models
from simulator.model.adapter import Placer, Unplaceable
from simulator.model.busy import Rows
from simulator.model.detail import RingState
from simulator.model.eventkinds import ARRIVE, DEFRAG, END, FAIL, MOVE, RELEASE, REPAIR, REQUEUE, RESUME, START
from simulator.model.failures import FailureClock, Failures
from simulator.model.interference import Busy, Interference
from simulator.model.lags import NONE as NO_LAGS
from simulator.model.network import GBPS, Fabric, ring_net
from simulator.model.results import JobResult, RunResult
from simulator.model.rings import Ring
from simulator.model.run_failures import FailureEvents
from simulator.model.run_moves import Moves
from simulator.model.runspec import SCHEDULER_LABELS, Options, Policy, policies, with_recovery, with_scheduler  # noqa: F401
from simulator.model.schedview import SchedulerView
from simulator.model.timeshift import best_shift

DEFAULT_OPTIONS = Options()


def dark_time(rack: Rack, diff: CircuitDiff) -> float:
    """Switching time of a change, as the OCS drivers model it (controller/drivers/ocs.py): one new
    circuit takes the per-connection time, several the bulk time; OCS switch in parallel."""
    made: dict[str, int] = {}  # new circuits per OCS (a circuit's first port is on its OCS)
    for c in diff.add:
        made[c[0].device] = made.get(c[0].device, 0) + 1
    worst = 0.0
    for name, count in made.items():  # the largest of the same values as OCS by OCS: any order
        spec = rack.ocs[name]
        worst = max(worst, (spec.switching_time_ms if count == 1 else spec.bulk_time_ms) / 1000)
    return worst


class Run(FailureEvents, Moves):
    """Simulate `jobs` on `rack` under `policy` (failures: simulator/model/run_failures.py; defragmentation:
    simulator/model/run_moves.py; what the admission policies see: simulator/model/schedview.py)."""

    def __init__(self, rack: Rack, jobs: list[JobSpec], policy: Policy, options: Options = DEFAULT_OPTIONS,
                 progress: Callable[[int], None] | None = None):
        if policy.recovery:
            options = replace(options, failures=replace(options.failures or Failures(), recovery=policy.recovery))
        else:
            options = replace(options, failures=None)
        self.rack, self.policy, self.o, self.progress = rack, policy, options, progress
        self.jobs = dict(enumerate(jobs))
        self.fabric = Fabric(rack)
        self.coarse = options.coarse(rack)
        limits = options.limits if self.coarse else replace(options.limits, window=max(options.limits.window, 1000))
        eff = options.net.efficiency
        self.inter = Interference([c * eff for c in self.fabric.capacity], options.net.step_latency_s, limits,
                                  options.force, options.net.sharing == "held")
        self.placer = Placer(rack)
        self.server_gpus = max(len(s.gpus) for s in rack.spec.servers)
        # each GPU's model and NIC line rate, read at every placement (the rack's GPU objects looked up once)
        self.gpu_model = {g: spec.model for g, spec in rack.gpus.items()}
        self.nic_gbps = {g: spec.nic.rate_gbps for g, spec in rack.gpus.items()}
        self.results = {i: JobResult(j.id, j.gpus, j.model, j.iterations, j.arrival_s, label=j.label)
                        for i, j in self.jobs.items()}
        self.key_of = {j.id: i for i, j in self.jobs.items()}
        self.running: set[int] = set()  # on the fabric now
        self.moving: set[int] = set()
        self.pending: dict[int, tuple[Ring, float]] = {}  # placed, not started: ring and start time
        self.queue: deque[int] = deque()
        self.heap: list[tuple[float, int, int, int, object]] = []
        self.seq = 0
        self.ocs_free = 0.0
        self.out = RunResult(policy, [], Rows("ddq"), [], frag=Rows("dqq"))
        self.iterations = {i: j.iterations for i, j in self.jobs.items()}  # derived at admission for durations
        self.replayed: set[int] = set()  # held for their recorded durations, off the simulated network
        self.replay_busy: list[tuple[float, float, float]] = []
        self.view = SchedulerView(self) if policy.scheduler in admission.NEEDS_CLUSTER else None
        self.since: dict[int, float] = {}  # when a job's current hold of GPUs began
        self.served: dict[int, float] = {}  # GPU-seconds run before its current hold (preempted jobs)
        self.resume: dict[int, RingState] = {}  # a preempted job's progress, to start from when placed again
        self.suspended: dict[int, float] = {}  # when a preempted job was stopped
        self.gen: dict[int, int] = {}  # times a job was stopped: events of an earlier placement are stale
        self.stalled: dict[int, RingState] = {}  # a moving job's state while its circuits are dark
        self.run_since: dict[int, tuple[float, float]] = {}  # when it last began iterating, and its progress then
        self.delay: dict[int, tuple[float, float]] = {}  # a restarted job: iterate no earlier than, and after
        # a job to swap spares into (recovery `swap`): its GPUs and their switches when it was interrupted
        self.swapping: dict[int, tuple[tuple[str, ...], set[str]]] = {}
        self.restarting: set[int] = set()  # placed again after an interruption, not iterating yet
        self.down: dict[str, float] = {}  # servers being repaired, and when they are back
        self.requeued = 0  # jobs waiting for a repair before they queue again
        self.arrived = 0
        self.releasing: dict[int, float] = {}  # ended, their GPUs not yet free: when they are (Lags.release_s)
        self.stoppers: dict[str, list[int]] = {}  # job -> the jobs stopped when it ends
        for i, j in self.jobs.items():
            if j.stops_with:
                self.stoppers.setdefault(j.stops_with, []).append(i)
        self.servers = {s.name: [g.name for g in s.gpus] for s in rack.spec.servers}
        self.clock = FailureClock(options.failures, sorted(self.servers)) if options.failures else None

    def push(self, t: float, kind: int, key: int = -1, data: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, key, data))

    def run(self) -> RunResult:
        for i, j in self.jobs.items():
            self.push(j.arrival_s, ARRIVE, i)
        if self.policy.defrag_s > 0:
            self.push(self.policy.defrag_s, DEFRAG)
        if self.clock is not None:
            self._next_failure(0.0)
        finished = 0
        handlers = {ARRIVE: self._arrive, START: self._start, MOVE: self._move, RESUME: self._resume,
                    DEFRAG: self._defragment, END: lambda t, key, _: self._finish(t, key),
                    FAIL: self._server_fails, REPAIR: self._repaired, REQUEUE: self._requeue,
                    RELEASE: lambda t, key, _: self._release(t, key)}
        now = 0.0
        while True:
            if not self.heap or self.heap[0][0] > now:  # events of this instant first: their changes are solved once
                nf = self.inter.next_finish()
                if nf is not None and (not self.heap or nf[0] <= self.heap[0][0]):
                    now = nf[0]
                    self._finish(*nf)
                    finished += 1
                    if self.progress:
                        self.progress(finished)
                    continue
            if not self.heap:
                break
            now, kind, _, key, data = heapq.heappop(self.heap)
            handlers[kind](now, key, data)
        self.out.jobs = [self.results[i] for i in sorted(self.results)]
        self.out.busy = self._busy()
        self.out.stats = dict(self.inter.stats)
        return self.out

    # --- admission ---------------------------------------------------------------------
    def _arrive(self, t: float, key: int, _) -> None:
        self.arrived += 1
        self.queue.append(key)
        self._admit(t)

    def _admit(self, t: float) -> None:
        self._place_queued(t)
        self._sample_fragmentation(t)

    def _sample_fragmentation(self, t: float) -> None:
        """The most free GPUs under one switch now, and all free GPUs: at every change of placement (every k-th
        beyond 100,000 changes, to bound the series), from the occupancy's counts per switch."""
        occ = getattr(self.placer, "occ", None)
        if occ is None or not hasattr(occ, "n_under"):
            return
        self._frag_calls = getattr(self, "_frag_calls", -1) + 1
        if self._frag_calls % max(1, 2 * len(self.jobs) // 100_000):
            return
        largest = max(occ.free_switch, default=0)
        self.out.frag.append((t, largest, sum(occ.free_model)))

    def _place_queued(self, t: float) -> None:
        """The run's admission policy (controller.core.admission, the controller's own code) over the simulated
        queue."""
        if self.view is not None:
            self.view.now = t
        drain = getattr(admission, self.policy.scheduler)  # looked up at each call, as the controller's is
        args = (self.queue, lambda key: self._attempt(t, key)) + ((self.view,) if self.view is not None else ())
        drain(*args)

    def _attempt(self, t: float, key: int) -> admission.Outcome:
        job = self.jobs[key]
        names, policy = job.names, job.policy or self.policy.placement
        if key in self.swapping:  # its survivors and a spare for each lost GPU, placed as the controller does
            names, policy = self._swapped(key), "regroup"
        try:
            p = None if names is None else self.placer.place(job.id, job.gpus, names, policy, job.model,
                                                             job.gpu_model or None)
        except Unplaceable as e:  # the controller fails such a job and goes on with the queue
            self._fail(t, key, str(e))
            return admission.Outcome.REFUSED
        if p is not None:
            self.swapping.pop(key, None)
        if p is None:
            if self.running or self.pending or self.moving or self.down or self.releasing:
                return admission.Outcome.WAIT  # it waits for GPUs to free up (or a server's repair)
            # nothing holds a GPU: no end of a job will make room for it
            self._fail(t, key, "could not be placed on the rack with no other job on it")
            return admission.Outcome.REFUSED
        ready = self._reconfigure(t, p.diff)
        lags, started = self.o.lags, t
        if lags != NO_LAGS:  # its containers start, then the ring's first iteration: later with more jobs starting
            starting = job.gpus + sum(self.jobs[k].gpus for k in self.pending)  # placed, not yet iterating
            busy = sum(self.jobs[k].gpus for k in self.running)
            c, s = self.o.jitter[key] if self.o.jitter is not None else (1.0, 1.0)
            started = t + c * lags.containers(starting, busy)
            ready = max(ready, started) + s * lags.start_delay(starting, busy)
        r = self.results[key]
        again = key in self.resume
        if not again:
            r.placed_s, r.started_s = t, started
        r.placement, r.switches = p.gpus, len(p.switches)
        self.since[key] = t
        ring = self._ring(key)
        if not again:
            r.alone_iteration_s = self.inter.period_alone(ring)
        if job.duration_s and not job.iterations and not again:
            if self.o.durations == "replayed":
                self.replayed.add(key)
                r.alone_run_s = job.duration_s
            else:  # alone on the fabric, it runs for its recorded duration
                self.iterations[key] = r.iterations = max(1, round(job.duration_s / r.alone_iteration_s))
        # held shares leave idle whatever a computing ring does not use: interleaving gains nothing
        if self.policy.timeshift and ring.links and self.o.net.sharing == "maxmin" and key not in self.replayed:
            r.shift_s, r.score_before, r.score_after = self._shift(ready, ring)
        if key in self.delay:  # restarted after an interruption
            earliest, after = self.delay.pop(key)
            ready = max(ready, earliest) + after
            self.restarting.add(key)
        self.pending[key] = (ring, ready + r.shift_s)
        self.push(ready + r.shift_s, START, key, self.gen.get(key, 0))
        return admission.Outcome.PLACED

    def _swapped(self, key: int) -> tuple[str, ...] | None:
        """A swapped job's GPUs: those of its GPUs still free (its survivors), and for each of the others a spare
        chosen by the controller's own rule (controller.core.spares); None while there are too few spares."""
        job, (old, switches) = self.jobs[key], self.swapping[key]
        occ = self.placer.occ
        free = [g for g in self.rack.gpus if occ.holder[occ.ix.gpu_id[g]] is None]
        survivors = [g for g in old if g in set(free)]
        lost = [g for g in old if g not in set(survivors)]
        where = self.placer.switch_of(self.rack.gpus)
        try:
            chosen = spares.choose(self.rack, lost, [g for g in free if g not in set(survivors)], job.model,
                                   switches, where, job.gpu_model or None)
        except NoRoomNow:
            return None
        return tuple(survivors + [chosen[g] for g in lost])

    def _fail(self, t: float, key: int, reason: str) -> None:
        r = self.results[key]
        r.failed, r.placed_s, r.started_s, r.start_s, r.end_s = reason, t, t, t, t

    def _reconfigure(self, t: float, diff: CircuitDiff) -> float:
        """An OCS change: it waits for the previous one (the controller makes one at a time);
        return when the new circuits carry traffic."""
        if not diff:
            return t
        begin = max(t, self.ocs_free)
        dark = dark_time(self.rack, diff)
        self.ocs_free = begin + dark + self.o.control_overhead_s
        self.out.reconfigurations += 1
        self.out.circuits_changed += len(diff.remove) + len(diff.add)
        self.out.dark_s += dark
        return self.ocs_free

    def _cost(self, key: int, gpus) -> models.Cost:
        nvlink = self.o.nvlink_gbps * GBPS
        nic = min([self.nic_gbps[g] for g in gpus]) * GBPS
        return models.cost(self.jobs[key].model, [self.gpu_model[g] for g in gpus], self.server_gpus, nvlink, nic)

    def _ring(self, key: int) -> Ring:
        gpus = self.placer.gpus[self.jobs[key].id]
        c = self._cost(key, gpus)
        extra = self.o.lags.iteration(c.gradient_bytes)
        computes = [s + extra for s in c.compute_s]
        net = ring_net(self.fabric, gpus, self.placer.switch_of(gpus), self.o.nvlink_gbps * GBPS)
        links = {} if self.policy.ideal else net.links  # non-blocking: no link between switches limits it
        latency = self.o.net.step_latency(c.gradient_bytes / len(gpus))
        return Ring(key, max(computes), statistics.fmean(computes), len(gpus), c.gradient_bytes,
                    net.cap * self.o.net.efficiency, links, self.coarse,
                    None if latency == self.o.net.step_latency_s else latency)

    def _shift(self, t: float, ring: Ring) -> tuple[float, float, float]:
        """The delay that interleaves a new ring with the rings it shares links with: those running
        (where they are in their iterations at `t`) and those about to start."""
        peers = []
        for k in sorted({k for link in ring.links for k in self.inter.users.get(link, ()) if k in self.running}):
            progress, period = self.inter.peek(t, k)[1], self.inter.period(k)
            peers.append((self.inter.rings[k], period, (progress % 1.0) * period))
        for _, (other, start) in sorted(self.pending.items()):
            if set(other.links) & set(ring.links):
                peers.append((other, self.inter.period_alone(other), t - start))
        if not peers:
            return 0.0, 0.0, 0.0
        return best_shift(ring, self.inter.period_alone(ring), peers, self.inter.capacity)

    def _start(self, t: float, key: int, gen: int) -> None:
        if key not in self.pending or gen != self.gen.get(key, 0):  # stopped before its circuits were ready
            return
        ring, _ = self.pending.pop(key)  # made at its placement; its GPUs stayed where they were since
        r = self.results[key]
        if key in self.restarting:
            self.restarting.discard(key)
            self.out.restart_gpu_s += (t - self.since[key]) * r.gpus
        if r.start_s < 0:
            r.start_s = t
        self.running.add(key)
        if key in self.replayed:
            duration = self.jobs[key].duration_s
            self.push(t + duration, END, key)
            self.replay_busy.append((t, t + duration, duration * self.jobs[key].gpus))
            return
        state = self.resume.pop(key, None)
        if state is not None:
            r.suspended_s += t - self.suspended.pop(key)
            state = RingState(remaining=ring.compute_s, done=state.done)  # from its last whole iteration
            self.run_since[key] = (t, float(state.done))
            self.inter.add(t, ring, self.iterations[key], state)
            return
        self.run_since[key] = (t, 0.0)
        self.inter.add(t, ring, self.iterations[key])

    def _stop(self, t: float, key: int) -> float:
        """Take a job off its GPUs wherever it is (placed, iterating, or stalled in a move); return its progress."""
        r = self.results[key]
        if key in self.pending:  # placed, circuits not ready: it did not iterate this time
            self.pending.pop(key)
            state = self.resume.get(key)
            progress = float(state.done) if state else 0.0
        elif key in self.running:
            _, progress = self.inter.remove(t, key)
            self.running.discard(key)
        else:  # stalled in a move
            progress = float(self.stalled.pop(key).done)
        self.moving.discard(key)
        self.restarting.discard(key)
        self.gen[key] = self.gen.get(key, 0) + 1
        began = self.since.pop(key)
        self.served[key] = self.served.get(key, 0.0) + (t - began) * r.gpus
        self.out.held.append((began, t, r.gpus))
        self.placer.release(self.jobs[key].id)
        self.suspended.setdefault(key, t)
        return progress

    def preempt(self, t: float, key: int) -> None:
        """Stop a job the scheduler preempts: its GPUs are freed, its whole iterations kept; it waits again, in the
        queue at its place by arrival."""
        progress = self._stop(t, key)
        self.resume[key] = RingState(done=int(progress + 1e-9))
        self.results[key].preemptions += 1
        bisect.insort(self.queue, key)

    def _finish(self, t: float, key: int, stopped: bool = False) -> None:
        done = 0.0 if key in self.replayed else self.inter.remove(t, key)[1]
        r = self.results[key]
        end = t if stopped else t + self.o.lags.end_s  # its ranks exit and the controller sees it
        r.end_s, r.end_lag_s, r.shared, r.stopped = end, end - t, key in self.inter.shared, stopped
        r.done = done if stopped else float(r.iterations)
        self.running.discard(key)
        free = end + (0.0 if stopped else self.o.lags.release_s)
        if free > t:  # its containers are removed before its GPUs are free
            self.releasing[key] = free
            self.push(free, RELEASE, key)
        else:
            self._release(t, key, admit=False)
        for k in self.stoppers.get(self.jobs[key].id, ()):
            if k in self.running:
                self._finish(t, k, stopped=True)
        self._admit(t)

    def _release(self, t: float, key: int, admit: bool = True) -> None:
        """An ended job's GPUs free again."""
        self.releasing.pop(key, None)
        self.placer.release(self.jobs[key].id)
        self.out.held.append((self.since.pop(key, self.results[key].placed_s), t, self.results[key].gpus))
        self.run_since.pop(key, None)
        if admit:
            self._admit(t)

    def _busy(self) -> list | Busy:
        """GPU-seconds of computing in each stretch the rings ran at one pace, and the replayed jobs'."""
        busy = self.inter.busy
        if self.replay_busy:
            for row in self.replay_busy:
                busy.add(*row)
        return busy



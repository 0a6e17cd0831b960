"""A job's life: placed (circuits and forwarding, confirmed), its containers started, its workers followed, and its end
(done, failed with the reason, or stopped), with everything it held given back.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from controller.core import placement as policy
from controller.core.circuits import CircuitDiff, CircuitMap
from controller.core.errors import OcsUnavailable
from controller.core.jobs import QUEUED, Job, transition
from controller.jobs.errors import Conflict, ReconfigFailed
from controller.jobs.steps import LOG, RECONFIG_WAIT, _attempt, _reason, _unexpected, displaced_note, request_of


class Lifecycle:
    def __init__(
        self,
        book,
        state,
        changes,
        containers,
        workers,
        runtime,
        lost: Callable[..., bool],
        freed: Callable[[], None],
        hold_configuring: bool = False,
        warm_up: Callable[[Job], None] = lambda job: None,
    ):
        self.book, self.state, self.changes, self.containers, self.workers, self.rt = (
            book, state, changes, containers, workers, runtime
        )  # fmt: skip
        self.lost = lost  # a worker is gone (failover.Failover.lost): whether the job is being recovered
        self.freed = freed  # GPUs were given back (queue.Queue.drain)
        self.hold_configuring = hold_configuring  # a fault hook for tests: jobs stop at configuring (_hold)
        self.warm_up = warm_up  # start the warm spares a running job asks for (warm.Warm.fill)
        self.lock = runtime.lock()  # plan and reconfigure one job at a time
        # (job, gpu) -> (the attempt its follower serves, the follower): a worker that keeps its process through a
        # recovery keeps its follower, carried on to the new attempt (carry)
        self.followers: dict[tuple[str, str], tuple[dict, object]] = {}

    def run(self, job: Job, admitted: policy.Plan | None = None) -> None:
        """The job's thread. Every way out ends the job: running on, done, or failed with the reason."""
        placed: dict = {}  # what the placement changed, for the undo
        try:
            with self.lock:
                transition(job, "configuring")
                self.book.save()
                self._place(job, placed, admitted)
                job.circuits = self.book.circuits_of(job)
                self.book.save()  # the plan that stands: what a restarted controller checks the devices against
            self.workers.start(job)
            if self.hold_configuring:
                self._hold(job)
            transition(job, "running", started_at=self.state.clock())
            self.book.save()
        except Exception as e:  # noqa: BLE001 (the edge: whatever a step raised, the job fails with it)
            self.fail(job, _reason(e), placed.get("diff"), e)
            return
        LOG.info("%s running on %s (switches %s)", job.id, ",".join(job.gpus), ",".join(job.switches))
        self.rt.spawn(self.warm_up, job)
        self.watch(job)

    def _hold(self, job: Job) -> None:
        """The fault hook (--optirack-fault-hold-configuring, for tests): the job's thread stops here, its circuits
        and containers in place and its state `configuring`, as if the controller died at this step."""
        LOG.warning("%s: held at configuring by --optirack-fault-hold-configuring", job.id)
        while True:
            self.rt.sleep(3600)

    def _place(self, job: Job, placed: dict, admitted: policy.Plan | None = None) -> None:
        """Plan the job's circuits from the map the reconfiguration lock protects, and apply them."""
        decided: dict = {}

        def plan(current: CircuitMap) -> CircuitMap:
            p = policy.plan(self.book.occ(current, exclude=job.id), request_of(job, named=True))
            decided.update(plan=p, diff=p.diff)
            return p.target(current)

        ev = self.changes.change(
            plan,
            "job",
            f"{job.id}: place {len(job.gpus)} GPUs ({job.request['policy']})",
            job=job.id,
            wait=RECONFIG_WAIT,
            note=lambda: displaced_note(self.state.rack, decided["diff"], job.gpus),
        )
        if ev is not None:
            placed["diff"] = decided["diff"]
            job.events.append(ev.id)
        p = decided["plan"]  # the admission's note (which GPUs, and why) for the placement that stands
        job.gpus, job.switches = list(p.gpus), list(p.switches)
        if admitted is not None:
            job.note = policy.restated(admitted, p)

    def fail(self, job: Job, reason: str, applied: CircuitDiff | None, error: BaseException | None = None) -> None:
        """End a job that could not run: its circuits back, its containers gone (last log lines kept)."""
        LOG.error("%s failed: %s", job.id, reason, exc_info=error if _unexpected(error) else None)
        if applied:
            _attempt(job, "restoring the circuits", self._reverse, job, applied)
        self._end(job, "failed", reason)

    def _end(self, job: Job, state: str, reason: str | None) -> None:
        """Keep the workers' last lines, remove the containers, record the final state. Never raises."""
        _attempt(job, "keeping the workers' logs", self.workers.keep_logs, job)
        _attempt(job, "removing the containers", self.workers.remove, job)
        _attempt(job, "removing the checkpoints", self.workers.remove_volumes, job)
        self.book.stopping.discard(job.id)  # its GPUs are free now
        for key in [k for k in self.followers if k[0] == job.id]:
            del self.followers[key]
        transition(job, state, reason=reason, ended_at=self.state.clock(), recovery=None)
        _attempt(job, "saving the job", self.book.save, job)
        _attempt(job, "starting queued jobs", self.freed)  # its GPUs are free

    def _reverse(self, job: Job, applied: CircuitDiff) -> None:
        """Put back the circuits this job's placement replaced, where nothing else has changed them."""

        def plan(current: CircuitMap) -> CircuitMap:
            keep = [c for c in current.circuits if c not in applied.add]
            used = {p for c in keep for p in c}
            return CircuitMap(keep + [c for c in applied.remove if not (set(c) & used)])

        try:
            ev = self.changes.change(plan, "job", f"{job.id}: undo placement", job=job.id, wait=RECONFIG_WAIT)
            if ev is not None:
                job.events.append(ev.id)
        except (ReconfigFailed, OcsUnavailable, Conflict) as e:  # anything else: _attempt logs it
            LOG.error("%s: could not restore the circuits: %s", job.id, e)

    # --- watching the workers ---------------------------------------------------------
    def carry(self, job: Job, gpus) -> None:
        """The workers of `gpus` kept their processes into the job's new attempt: so do their followers."""
        for gpu in gpus:
            if (job.id, gpu) in self.followers:
                self.followers[(job.id, gpu)][0]["attempt"] = job.attempt

    def _follower(self, job: Job, gpu: str, kept) -> object:
        held = self.followers.get((job.id, gpu))
        if gpu in kept and held is not None and held[0]["attempt"] == job.attempt:
            return held[1]
        serves = {"attempt": job.attempt}
        self.followers[(job.id, gpu)] = (serves, None)  # what _follow takes as it starts
        thread = self.rt.spawn(self._follow, job, gpu, raise_error=True)
        self.followers[(job.id, gpu)] = (serves, thread)
        return thread

    def watch(self, job: Job, kept=()) -> None:
        """Follow the job's workers to their end (`kept`: GPUs whose workers kept their processes and followers)."""
        attempt = job.attempt
        try:
            threads = [self._follower(job, gpu, kept) for gpu in job.gpus]
            self.book.threads[job.id] = threads
            self.rt.joinall(threads)
            if job.state != "running" or job.attempt != attempt:
                return  # stopped, failed or recovering meanwhile (the recovery follows the next attempt)
            unknown = [g for g in job.gpus if g not in job.exit_codes]
            if unknown:
                raise RuntimeError(f"the worker on {unknown[0]} ended without an exit code")
            failed = {g: c for g, c in job.exit_codes.items() if c != 0}
            if failed:
                gpu, code = next(iter(failed.items()))
                last = next((r for r in reversed(job.reports.get(gpu, [])) if r.get("event") == "error"), None)
                after = f" (after {len(job.recoveries)} recoveries)" if job.recoveries else ""
                self.finish(
                    job,
                    "failed",
                    f"the worker on {gpu} exited with {code}" + (f": {last['error']}" if last else "") + after,
                )
            else:
                self.finish(job, "done", None)
        except Exception as e:  # noqa: BLE001 (the edge: a running job never stays running because of a bug)
            if job.active:
                LOG.exception("%s: following the workers failed", job.id)
                self.workers.kill_all(job)
                self.finish(job, "failed", _reason(e))

    def _follow(self, job: Job, gpu: str) -> None:
        """Read one worker's JSON lines as they come (tagged with the attempt they say, else the one this follower
        serves); record its exit code; a worker that failed starts the job's recovery (failover.py), or, if it is
        not recovered, stops the others."""
        server = self.state.rack.server_of[gpu]
        serves = self.followers.get((job.id, gpu), ({"attempt": job.attempt},))[0]
        swap = killed = False
        try:
            job.reports.setdefault(gpu, [])
            buf = b""
            for chunk in self.containers.logs(job.id, gpu, server):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.startswith(b"{"):
                        try:
                            job.record(gpu, {"attempt": serves["attempt"], **json.loads(line)})
                        except ValueError:
                            pass
            code = self.containers.wait(job.id, gpu, server)
            why = f"the worker on {gpu} exited with {code}"
            swap = killed = code > 128  # killed by a signal (kill -9, the OOM killer): its GPU is suspect
        except Exception as e:  # noqa: BLE001 (the container vanished, or its engine went down)
            down = None if self.containers.engines.ping(server) else self.containers.down_servers().get(server)
            why = str(e) if down is None else f"the Docker Engine of server {server} went down ({down})"
            if job.attempt == serves["attempt"]:
                LOG.error("%s: lost the worker on %s: %s", job.id, gpu, why)
                job.record(gpu, {"event": "error", "error": why, "attempt": serves["attempt"]})
            code, swap = -1, True
        if job.attempt != serves["attempt"]:
            return  # a worker of an attempt the recovery stopped
        job.exit_codes[gpu] = code
        if code != 0 and job.state in ("running", "recovering"):
            last = next((r for r in reversed(job.reports.get(gpu, [])) if r.get("event") == "error"), None)
            if last and last.get("error") not in why:
                why += f": {last['error']}"
            if not self.lost(job, gpu, why, swap, killed=killed) and job.state == "running":
                LOG.warning("%s: the worker on %s exited with %s; stopping the others", job.id, gpu, code)
                for other in job.gpus:
                    if other != gpu:
                        self.workers.kill(job, other)

    def finish(self, job: Job, state: str, reason: str | None) -> None:
        self._end(job, state, reason)
        completion = job.completion_s()
        LOG.info("%s %s%s", job.id, state, f" in {completion:.1f} s" if completion else f": {reason}" if reason else "")

    def stop(self, job: Job, stop_queued: Callable[[Job], None]) -> Job:
        """Stop a job: a queued one leaves the queue (`stop_queued`); a running or recovering one has its workers
        killed and ends `stopped`; an ended one is left as it is. Conflict while it is being placed."""
        if job.state == QUEUED:
            stop_queued(job)
            return job
        if not job.active:
            return job
        if job.state not in ("running", "recovering"):
            raise Conflict(f"{job.id} is {job.state}; stop it once it runs")
        self.book.stopping.add(job.id)  # its GPUs stay held until its containers are gone (_end)
        transition(job, "stopped", reason="stopped by request")
        self.book.awaiting.discard(job.id)
        for gpu in job.gpus:
            self.workers.kill(job, gpu)
        self.rt.joinall(self.book.threads.get(job.id, []))
        self.finish(job, "stopped", "stopped by request")
        return job

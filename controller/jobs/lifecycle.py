"""A job's life: placed (circuits and forwarding, confirmed), its containers started, its workers followed, and its end
(done, failed with the reason, or stopped), with everything it held given back.
"""

from __future__ import annotations

import json

from controller.core import placement as policy
from controller.core.circuits import CircuitDiff, CircuitMap, displaced
from controller.core.errors import OcsUnavailable
from controller.core.jobs import DEFAULT_CHECKPOINT_EVERY, QUEUED, Job, transition
from controller.drivers.containers import CHECKPOINTS, ContainerError, GpuContainer
from controller.drivers.engines import EngineDown
from controller.jobs.errors import Conflict, ReconfigFailed
from controller.jobs.steps import LOG, LOG_LINES, RECONFIG_WAIT, _attempt, _reason, _unexpected


class LifecycleMixin:
    def _run(self, job: Job, admitted: policy.Plan | None = None) -> None:
        """The job's thread. Every way out ends the job: running on, done, or failed with the reason."""
        placed: dict = {}  # what the placement changed, for the undo
        try:
            with self.admission:
                transition(job, "configuring")
                self.save()
                self._place(job, placed, admitted)
                job.circuits = self._circuits_of(job)
                self.save()  # the plan that stands: what a restarted controller checks the devices against
            self._start_containers(job)
            if self.hold_configuring:
                self._hold(job)
            transition(job, "running", started_at=self.ctx.clock())
            self.save()
        except Exception as e:  # noqa: BLE001 (the edge: whatever a step raised, the job fails with it)
            self._fail(job, _reason(e), placed.get("diff"), e)
            return
        LOG.info("%s running on %s (switches %s)", job.id, ",".join(job.gpus), ",".join(job.switches))
        self._watch(job)

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
            p = policy.plan(self.occ(current, exclude=job.id), self._request(job, named=True))
            decided.update(plan=p, diff=p.diff)
            return p.target(current)

        ev = self.ctx.ocs.change(
            plan,
            "job",
            f"{job.id}: place {len(job.gpus)} GPUs ({job.request['policy']})",
            job=job.id,
            wait=RECONFIG_WAIT,
            note=lambda: self._note(job, decided["diff"]),
        )
        if ev is not None:
            placed["diff"] = decided["diff"]
            job.events.append(ev.id)
        p = decided["plan"]  # the admission's note (which GPUs, and why) for the placement that stands
        job.gpus, job.switches = list(p.gpus), list(p.switches)
        if admitted is not None:
            job.note = policy.restated(admitted, p)

    def _note(self, job: Job, diff: CircuitDiff) -> str:
        """What the event should say: the idle GPUs whose circuits the job took (no free port was left)."""
        moved = displaced(self.ctx.rack, diff, job.gpus)
        return "; ".join(moved) + " (no free switch port was left)" if moved else ""

    def _circuits_of(self, job: Job) -> list[list[str]]:
        out = []
        for g in job.gpus:
            p = self.ctx.rack.gpu_port(g)
            other = self.ctx.circuits.partner(p)
            if other is not None:
                out.append([str(p), str(other)])
        return out

    def _checkpoint_peer(self, job: Job, rank: int) -> str | None:
        """The NIC address of the next rank around the ring on another server (None: all on one server)."""
        server_of, n = self.ctx.rack.server_of, len(job.gpus)
        for step in range(1, n):
            other = job.gpus[(rank + step) % n]
            if server_of[other] != server_of[job.gpus[rank]]:
                return self.ctx.rack.addresses[other][0]
        return None

    def _command(self, job: Job, rank: int, restore: tuple[int, str, str] | None = None) -> list[str]:
        w = job.request["workload"]
        master = self.ctx.rack.addresses[job.gpus[0]][0]
        cmd = [
            "--rank",
            str(rank),
            "--world-size",
            str(len(job.gpus)),
            "--master",
            master,
            "--mode",
            w["mode"],
            "--iterations",
            str(w["iterations"]),
            "--rate-scale",
            str(self.ctx.rack.spec.emulation.rate_scale),
            "--time-dilation",
            str(self.ctx.rack.spec.emulation.time_dilation),
            "--wait-for-nic",
            "60",
            "--batch",
            str(w["batch"]),
        ]
        if w["mode"] == "profile":
            cmd += ["--workload", w["model"]]
        if w.get("compute_seconds") is not None:
            cmd += ["--compute-seconds", str(w["compute_seconds"])]
        every = job.request.get("checkpoint_every", DEFAULT_CHECKPOINT_EVERY)
        cmd += ["--checkpoint-dir", CHECKPOINTS, "--checkpoint-every", str(every)]
        peer = self._checkpoint_peer(job, rank)
        if peer is not None:
            cmd += ["--checkpoint-peer", peer]
        if restore is not None:
            cmd += ["--resume-from", str(restore[0]), "--restore-from", restore[1], "--restore-writer", restore[2]]
        return cmd

    def _start_containers(self, job: Job, restores: dict | None = None, reuse: bool = False) -> None:
        """One sandbox, NIC and worker per GPU, on each GPU's own server's engine, all at once; the
        engines are asked first, so a server that is down fails the job at once, naming it. After a loss
        (failover.py): each rank's checkpoint to restore, and the survivors' sandboxes kept (`reuse`)."""
        restores = restores or {}
        rack, prefix = self.ctx.rack, self.ctx.rack.spec.network.subnet.prefixlen
        servers = {rack.server_of[g] for g in job.gpus}
        try:
            self.driver.check_engines(servers)
            image = self.driver.worker_image(rack.server_of[job.gpus[0]])
        except EngineDown as e:
            raise ContainerError(str(e)) from None
        except Exception as e:  # noqa: BLE001 (registry or engine refused: fail the job with the reason)
            raise ContainerError(
                f"cannot start the containers: the worker image {self.driver.image} cannot be had "
                f"({str(e).strip().splitlines()[-1] if str(e).strip() else e.__class__.__name__})"
            ) from None
        job.image = image

        def one(rank: int, gpu: str) -> None:
            g = rack.gpus[gpu]
            self.driver.start(
                GpuContainer(
                    job.id,
                    gpu,
                    rack.server_of[gpu],
                    g.index,
                    g.model,
                    rack.interface(gpu),
                    f"{rack.addresses[gpu][0]}/{prefix}",
                    self._command(job, rank, restores.get(gpu)),
                ),
                image,
                reuse=reuse,
            )

        threads = [self.rt.spawn(one, rank, gpu, raise_error=True) for rank, gpu in enumerate(job.gpus)]
        errors = []
        for t in threads:
            try:
                t.wait()
            except Exception as e:  # noqa: BLE001 (collected: the first one is the job's reason)
                errors.append(e)
        if errors:
            self._remove_containers(job)
            raise errors[0]  # the job's edge tells an expected failure from a bug by its type

    def _remove_containers(self, job: Job, gpus=None) -> None:
        """Give each NIC back and remove the containers, on every engine at once; an engine that is
        down is skipped (its containers are swept when it comes back)."""

        def one(gpu: str) -> None:
            server = self.ctx.rack.server_of[gpu]
            try:
                self.driver.remove(job.id, gpu, server)
            except Exception as e:  # noqa: BLE001 (keep cleaning the others)
                LOG.error("%s: removing the containers of %s on %s: %s", job.id, gpu, server, e)

        self.rt.joinall([self.rt.spawn(one, gpu) for gpu in (gpus if gpus is not None else job.gpus)])

    def _fail(self, job: Job, reason: str, applied: CircuitDiff | None, error: BaseException | None = None) -> None:
        """End a job that could not run: its circuits back, its containers gone (last log lines kept)."""
        LOG.error("%s failed: %s", job.id, reason, exc_info=error if _unexpected(error) else None)
        if applied:
            _attempt(job, "restoring the circuits", self._reverse, job, applied)
        self._end(job, "failed", reason)

    def _end(self, job: Job, state: str, reason: str | None) -> None:
        """Keep the workers' last lines, remove the containers, record the final state. Never raises."""
        _attempt(job, "keeping the workers' logs", self._keep_logs, job)
        _attempt(job, "removing the containers", self._remove_containers, job)
        _attempt(job, "removing the checkpoints", self._remove_volumes, job)
        self._stopping.discard(job.id)  # its GPUs are free now
        transition(job, state, reason=reason, ended_at=self.ctx.clock())
        _attempt(job, "saving the job", self.save, job)
        _attempt(job, "starting queued jobs", self._drain_queue)  # its GPUs are free

    def _keep_logs(self, job: Job) -> None:
        """The last lines of each worker's output (stdout and stderr), read before its container goes."""
        for gpu in job.gpus:
            try:
                job.logs[gpu] = self.driver.tail(job.id, gpu, self.ctx.rack.server_of[gpu], LOG_LINES)
            except Exception as e:  # noqa: BLE001 (no container, or no engine: nothing to keep)
                LOG.debug("%s: no logs of %s: %s", job.id, gpu, e)

    def worker_logs(self, job: Job, tail: int = LOG_LINES) -> tuple[dict[str, list[str]], str]:
        """A running job's live log lines (from its containers), else the lines kept when it ended."""
        if job.state == "running":
            live = {}
            for gpu in job.gpus:
                try:
                    live[gpu] = self.driver.tail(job.id, gpu, self.ctx.rack.server_of[gpu], tail)
                except Exception as e:  # noqa: BLE001 (report what can be read)
                    live[gpu] = [f"(cannot read the container's log: {e})"]
            return live, "containers"
        return {g: lines[-tail:] for g, lines in job.logs.items()}, "kept when the job ended"

    def _reverse(self, job: Job, applied: CircuitDiff) -> None:
        """Put back the circuits this job's placement replaced, where nothing else has changed them."""

        def plan(current: CircuitMap) -> CircuitMap:
            keep = [c for c in current.circuits if c not in applied.add]
            used = {p for c in keep for p in c}
            return CircuitMap(keep + [c for c in applied.remove if not (set(c) & used)])

        try:
            ev = self.ctx.ocs.change(plan, "job", f"{job.id}: undo placement", job=job.id, wait=RECONFIG_WAIT)
            if ev is not None:
                job.events.append(ev.id)
        except (ReconfigFailed, OcsUnavailable, Conflict) as e:  # anything else: _attempt logs it
            LOG.error("%s: could not restore the circuits: %s", job.id, e)

    # --- watching the workers ---------------------------------------------------------
    def _watch(self, job: Job) -> None:
        attempt = job.attempt
        try:
            threads = [self.rt.spawn(self._follow, job, gpu, raise_error=True) for gpu in job.gpus]
            self._threads[job.id] = threads
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
                self._finish(
                    job,
                    "failed",
                    f"the worker on {gpu} exited with {code}" + (f": {last['error']}" if last else "") + after,
                )
            else:
                self._finish(job, "done", None)
        except Exception as e:  # noqa: BLE001 (the edge: a running job never stays running because of a bug)
            if job.active:
                LOG.exception("%s: following the workers failed", job.id)
                self._kill_all(job)
                self._finish(job, "failed", _reason(e))

    def _kill_all(self, job: Job) -> None:
        for gpu in job.gpus:
            _attempt(job, f"stopping the worker on {gpu}", self._kill, job, gpu)

    def _follow(self, job: Job, gpu: str) -> None:
        """Read one worker's JSON lines as they come (tagged with the job's attempt); record its exit code; a worker
        that failed starts the job's recovery (failover.py), or, if it is not recovered, stops the others."""
        server, attempt = self.ctx.rack.server_of[gpu], job.attempt
        swap = False
        try:
            job.reports.setdefault(gpu, [])
            buf = b""
            for chunk in self.driver.logs(job.id, gpu, server):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.startswith(b"{"):
                        try:
                            job.record(gpu, {**json.loads(line), "attempt": attempt})
                        except ValueError:
                            pass
            code = self.driver.wait(job.id, gpu, server)
            why = f"the worker on {gpu} exited with {code}"
            swap = code > 128  # killed by a signal (kill -9, the OOM killer): its GPU is not trusted again
        except Exception as e:  # noqa: BLE001 (the container vanished, or its engine went down)
            down = None if self.driver.engines.ping(server) else self.driver.down_servers().get(server)
            why = str(e) if down is None else f"the Docker Engine of server {server} went down ({down})"
            if job.attempt == attempt:
                LOG.error("%s: lost the worker on %s: %s", job.id, gpu, why)
                job.record(gpu, {"event": "error", "error": why, "attempt": attempt})
            code, swap = -1, True
        if job.attempt != attempt:
            return  # a worker of an attempt the recovery stopped
        job.exit_codes[gpu] = code
        if code != 0 and job.state in ("running", "recovering"):
            last = next((r for r in reversed(job.reports.get(gpu, [])) if r.get("event") == "error"), None)
            if last and last.get("error") not in why:
                why += f": {last['error']}"
            if not self._lost(job, gpu, why, swap) and job.state == "running":
                LOG.warning("%s: the worker on %s exited with %s; stopping the others", job.id, gpu, code)
                for other in job.gpus:
                    if other != gpu:
                        self._kill(job, other)

    def _kill(self, job: Job, gpu: str) -> None:
        try:
            self.driver.kill(job.id, gpu, self.ctx.rack.server_of[gpu])
        except Exception as e:  # noqa: BLE001 (already gone, or its engine is down)
            LOG.debug("%s: kill %s: %s", job.id, gpu, e)

    def _finish(self, job: Job, state: str, reason: str | None) -> None:
        self._end(job, state, reason)
        completion = job.completion_s()
        LOG.info("%s %s%s", job.id, state, f" in {completion:.1f} s" if completion else f": {reason}" if reason else "")

    def stop_job(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.state == QUEUED:
            with self._admit:
                self.queue.remove(job_id)
                transition(job, "stopped", reason="stopped while queued", ended_at=self.ctx.clock(), position=None)
                self._number_queue()
                self.save(job)
            self._drain_queue()  # the next one may fit now
            return job
        if not job.active:
            return job
        if job.state not in ("running", "recovering"):
            raise Conflict(f"{job_id} is {job.state}; stop it once it runs")
        self._stopping.add(job.id)  # its GPUs stay held until its containers are gone (_end)
        transition(job, "stopped", reason="stopped by request")
        self._awaiting.discard(job.id)
        for gpu in job.gpus:
            self._kill(job, gpu)
        self.rt.joinall(self._threads.get(job.id, []))
        self._finish(job, "stopped", "stopped by request")
        return job

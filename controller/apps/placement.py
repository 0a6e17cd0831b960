"""The placement app: runs jobs. Admit or queue (first in, first out) -> plan (core.placement) ->
OCS diff and flows (OCS app, confirmed) -> one container per GPU (container driver) -> watch the
workers -> clean up, and start the queued jobs that fit now. A failure at any step undoes what
was done: the job's circuit changes are reversed, its containers removed, its GPUs freed, and the
job fails with the reason. Defragmentation (core.defrag) moves running jobs in one change. Jobs
and circuits are persisted, so a restarted controller takes its running jobs and its queue back.
"""
from __future__ import annotations

import collections
import itertools
import json
import logging

from ryu.base import app_manager

from controller.apps.context import Conflict, Optirack
from controller.apps.ocs import ReconfigFailed
from controller.apps.runtime import HubRuntime
from controller.config import conf
from controller.core import admission, defrag
from controller.core import placement as policy
from controller.core.circuits import CircuitDiff, CircuitMap, displaced
from controller.core.jobs import ACTIVE, QUEUED, TERMINAL, Job, JobRequest, JobTable, transition
from controller.core.occupancy import Occupancy
from controller.core.rack import PortRef
from controller.drivers.containers import ContainerDriver, ContainerError, GpuContainer
from controller.drivers.engines import EngineDown
from controller.drivers.ocs import OcsUnavailable
from controller.jobs.runtime import Runtime

LOG = logging.getLogger("optirack.placement")
RECONFIG_WAIT = 120.0  # seconds a job waits for another reconfiguration to finish
LOG_LINES = 50  # last lines of each worker's output kept when its job ends
KEPT_PLANS = 8  # defragmentation plans remembered for `POST /regroup {"version": N}`
EXPECTED = (policy.PlacementError, ReconfigFailed, OcsUnavailable, Conflict, ContainerError)


class UnknownJob(KeyError):
    pass


def _reason(e: BaseException) -> str:
    """A failed job's reason: the message of an error we expect, the error's type too for any other."""
    return str(e) if not _unexpected(e) else f"{type(e).__name__}: {e}"


def _unexpected(e: BaseException | None) -> bool:
    return e is not None and not isinstance(e, EXPECTED)


def _attempt(job: Job, what: str, step, *args) -> None:
    """Run one clean-up step; log its failure and go on with the next."""
    try:
        step(*args)
    except Exception:  # noqa: BLE001 (clean-up goes on whatever one step raised)
        LOG.exception("%s: %s failed", job.id, what)


class PlacementApp(app_manager.RyuApp):
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        self.rt: Runtime = kwargs.get("runtime") or HubRuntime()
        self.ctx.placement = self
        self.driver = kwargs.get("driver") or ContainerDriver(
            self.ctx.rack, conf().worker_image, nic_home=conf().nic_home
        )
        self.jobs = JobTable(Job.from_state(j) for j in self.ctx.saved.get("jobs", []))
        start = max((int(j.split("-")[-1]) for j in self.jobs if j.split("-")[-1].isdigit()), default=0) + 1
        self._ids = itertools.count(start)
        self.admission = self.rt.lock()  # plan and reconfigure one job at a time
        self._admit = self.rt.lock()  # admission (submit and the queue) one job at a time
        self.queue: collections.deque[str] = collections.deque(
            j.id for j in sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id)) if j.state == QUEUED
        )
        self.occupancy = Occupancy(self.ctx.rack, self.ctx.circuits, self.busy_gpus())
        self._plans: collections.OrderedDict[int, dict] = collections.OrderedDict()  # version -> dry-run plan
        self._threads: dict[str, list] = {}
        self.rt.spawn(self._recover)
        self.engine_poll = kwargs.get("engine_poll") or conf().engine_poll
        self.rt.spawn(self._watch_engines)
        if self.queue:
            self.rt.spawn(self._drain_when_ready)

    # --- what other apps and the REST API ask ---------------------------------------
    def busy_gpus(self) -> dict[str, str]:
        return {g: j.id for j in self.jobs.values() if j.active for g in j.gpus or self._requested(j)}

    gpu_jobs = busy_gpus

    @staticmethod
    def _requested(job: Job) -> list[str]:
        gpus = job.request.get("gpus")
        return gpus if isinstance(gpus, list) else []

    def protected_ports(self, exclude: str | None = None, circuits: CircuitMap | None = None) -> dict[PortRef, str]:
        """OCS ports of active jobs' GPUs and their circuits' other ends (in `circuits`, default the current map)."""
        circuits = circuits if circuits is not None else self.ctx.circuits
        result = {}
        for job in self.jobs.values():
            if job.active and job.id != exclude:
                for g in job.gpus:
                    p = self.ctx.rack.gpu_port(g)
                    result[p] = job.id
                    other = circuits.partner(p)
                    if other is not None:
                        result[other] = job.id
        return result

    def get(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise UnknownJob(job_id)
        return self.jobs[job_id]

    def save(self, job: Job | None = None) -> None:
        """Persist `job` (a job that just ended must be named) and every active job, with the circuits:
        one transaction whose size does not grow with the history of finished jobs."""
        jobs = self.jobs.to_save(job)
        self.ctx.save(jobs=[j.to_state() for j in jobs])
        self.jobs.saved(jobs)

    def page(
        self, limit: int, before: str | None = None, states: set[str] | None = None
    ) -> tuple[list[Job], str | None]:
        """The newest `limit` jobs created before job `before` (in `states`), oldest first, and the id
        to pass as `before` for the page before it (None: no older job)."""
        jobs = list(self.jobs.values())
        if before is not None:
            jobs = jobs[: list(self.jobs).index(self.get(before).id)]
        if states:
            jobs = [j for j in jobs if j.state in states]
        page = jobs[-limit:]
        return page, (page[0].id if len(jobs) > len(page) else None)

    def prune(self, older_than_s: float | None, keep: int | None) -> list[str]:
        """Forget finished jobs that ended more than `older_than_s` ago, keeping the newest `keep` of them."""
        now = self.ctx.clock()
        finished = [j for j in self.jobs.values() if j.state in TERMINAL]
        candidates = finished[: max(0, len(finished) - (keep or 0))]
        gone = [j.id for j in candidates if older_than_s is None or (j.ended_at or j.created_at) <= now - older_than_s]
        self.ctx.store.delete_jobs(gone)
        for job_id in gone:
            del self.jobs[job_id]
        LOG.info("pruned %d finished jobs", len(gone))
        return gone

    # --- submitting, the queue, and placing --------------------------------------------
    def occ(self, circuits: CircuitMap | None = None, exclude: str | None = None, admitting: bool = False) -> Occupancy:
        """The occupancy brought up to date with `circuits` (default: now) and the active jobs' GPUs;
        `admitting`: the GPUs of servers whose Docker Engine is down count as held too (a new job avoids them)."""
        holders = {g: j for g, j in self.busy_gpus().items() if j != exclude}
        if admitting:
            down = self.down_servers()
            holders.update(
                {
                    g: f"the engine of {s} (down)"
                    for g, s in self.ctx.rack.server_of.items()
                    if s in down and g not in holders
                }
            )
        self.occupancy.sync(self.ctx.circuits if circuits is None else circuits, holders)
        return self.occupancy

    @staticmethod
    def _request(job: Job, named: bool = False) -> policy.Request:
        r = job.request
        gpus = job.gpus if named else r["gpus"]
        return policy.Request(
            gpus if isinstance(gpus, int) else tuple(gpus),
            r["policy"],
            r.get("gpu_model"),
            r["workload"].get("model", "vgg16"),
        )

    def submit(self, req: JobRequest) -> Job:
        """Admit a job: placed at once (its GPUs reserved, started in the background), or queued.

        Raises policy.InvalidRequest (bad input), policy.NoRoomNow (cannot be placed now and
        `queue` is false) or policy.PlacementError (this rack can never place it); nothing changes then.
        """
        job = Job(id="", request=req.model_dump(), created_at=self.ctx.clock())
        if isinstance(req.gpus, list) and set(req.gpus) <= set(self.ctx.rack.gpus):
            self._refuse_down_engines(req.gpus)  # 409 naming the server, not a wait in the queue
        with self._admit:
            try:
                p = policy.plan(self.occ(admitting=True), self._request(job))
            except policy.NoRoomNow as e:
                p, wait = None, str(e)
            if p is not None and self.queue:
                p, wait = None, f"{len(self.queue)} queued job(s) ahead (first in, first out)"
            if p is None and not req.queue:
                raise policy.NoRoomNow(f"{wait}; not queued (queue: false)")
            job.id = f"job-{next(self._ids)}"
            self.jobs[job.id] = job
            if p is None:
                transition(job, QUEUED, note=f"waiting: {wait}")
                self.queue.append(job.id)
                self._number_queue()
                self.save(job)
                LOG.info("%s queued at position %d: %s", job.id, job.position, wait)
            else:
                self._admit_job(job, p)
        return job

    def _admit_job(self, job: Job, p: policy.Plan) -> None:
        transition(job, "pending", gpus=list(p.gpus), switches=list(p.switches), note=p.note)
        self.save()
        LOG.info(
            "%s admitted: %d GPUs %s, policy %s; %s",
            job.id,
            len(p.gpus),
            ",".join(p.gpus),
            job.request["policy"],
            p.note,
        )
        self.rt.spawn(self._run, job, p)

    def _number_queue(self) -> None:
        for i, job_id in enumerate(self.queue):
            self.jobs[job_id].position = i + 1

    def _drain_queue(self) -> None:
        """Start queued jobs, in order of arrival, while the first one can be placed."""
        def attempt(job_id: str) -> admission.Outcome:
            job = self.jobs[job_id]
            try:
                p = policy.plan(self.occ(admitting=True), self._request(job))
            except policy.NoRoomNow as e:
                job.note = f"waiting: {e}"
                return admission.Outcome.WAIT
            except policy.PlacementError as e:  # the rack changed under it: it can never run
                transition(job, "failed", reason=str(e), ended_at=self.ctx.clock(), position=None)
                self.save(job)
                return admission.Outcome.REFUSED
            job.position = None
            self._admit_job(job, p)
            return admission.Outcome.PLACED

        with self._admit:
            admission.fifo(self.queue, attempt)
            self._number_queue()
            self.save()

    def _drain_when_ready(self, timeout: float = 60.0) -> None:
        """After a restart: start queued jobs once every OCS is back in sync (or after `timeout` s)."""
        waited = 0.0
        while self.ctx.ocs and set(self.ctx.ocs.synchronised) != set(self.ctx.rack.ocs) and waited < timeout:
            self.rt.sleep(0.2)
            waited += 0.2
        self._drain_queue()

    def _refuse_down_engines(self, gpus: list[str]) -> None:
        """409 naming the server, for GPUs whose server's engine does not answer now."""
        servers = sorted({self.ctx.rack.server_of[g] for g in gpus})
        down = {s: self.down_servers()[s] for s in servers if not self.driver.engines.ping(s)}
        if down:
            raise Conflict(
                "gpus: "
                + "; ".join(
                    f"the Docker Engine of server {s} is down ({why}): "
                    f"{', '.join(g for g in gpus if self.ctx.rack.server_of[g] == s)} cannot run"
                    for s, why in down.items()
                )
            )

    def _run(self, job: Job, admitted: policy.Plan | None = None) -> None:
        """The job's thread. Every way out ends the job: running on, done, or failed with the reason."""
        placed: dict = {}  # what the placement changed, for the undo
        try:
            with self.admission:
                transition(job, "configuring")
                self.save()
                self._place(job, placed, admitted)
                job.circuits = self._circuits_of(job)
            self._start_containers(job)
            transition(job, "running", started_at=self.ctx.clock())
            self.save()
        except Exception as e:  # noqa: BLE001 (the edge: whatever a step raised, the job fails with it)
            self._fail(job, _reason(e), placed.get("diff"), e)
            return
        LOG.info("%s running on %s (switches %s)", job.id, ",".join(job.gpus), ",".join(job.switches))
        self._watch(job)

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

    def _command(self, job: Job, rank: int) -> list[str]:
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
        return cmd

    def _start_containers(self, job: Job) -> None:
        """One sandbox, NIC and worker per GPU, on each GPU's own server's engine, all at once; the
        engines are asked first, so a server that is down fails the job at once, naming it."""
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
                    self._command(job, rank),
                ),
                image,
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
        try:
            threads = [self.rt.spawn(self._follow, job, gpu, raise_error=True) for gpu in job.gpus]
            self._threads[job.id] = threads
            self.rt.joinall(threads)
            if job.state != "running":
                return  # stopped or failed meanwhile
            unknown = [g for g in job.gpus if g not in job.exit_codes]
            if unknown:
                raise RuntimeError(f"the worker on {unknown[0]} ended without an exit code")
            failed = {g: c for g, c in job.exit_codes.items() if c != 0}
            if failed:
                gpu, code = next(iter(failed.items()))
                last = next((r for r in reversed(job.reports.get(gpu, [])) if r.get("event") == "error"), None)
                self._finish(
                    job, "failed", f"the worker on {gpu} exited with {code}" + (f": {last['error']}" if last else "")
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
        """Read one worker's JSON lines as they come; record its exit code; stop the job if it failed."""
        server = self.ctx.rack.server_of[gpu]
        try:
            job.reports[gpu] = []
            buf = b""
            for chunk in self.driver.logs(job.id, gpu, server):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.startswith(b"{"):
                        try:
                            job.record(gpu, json.loads(line))
                        except ValueError:
                            pass
            job.exit_codes[gpu] = self.driver.wait(job.id, gpu, server)
        except Exception as e:  # noqa: BLE001 (the container vanished, or its engine went down)
            why = (
                str(e)
                if self.driver.engines.ping(server)
                else f"the Docker Engine of server {server} went down ({self.driver.down_servers().get(server)})"
            )
            LOG.error("%s: lost the worker on %s: %s", job.id, gpu, why)
            job.record(gpu, {"event": "error", "error": why})
            job.exit_codes[gpu] = -1
        if job.exit_codes[gpu] != 0 and job.state == "running":
            LOG.warning("%s: the worker on %s exited with %s; stopping the others", job.id, gpu, job.exit_codes[gpu])
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
        if job.state != "running":
            raise Conflict(f"{job_id} is {job.state}; stop it once it runs")
        transition(job, "stopped", reason="stopped by request")
        for gpu in job.gpus:
            self._kill(job, gpu)
        self.rt.joinall(self._threads.get(job.id, []))
        self._finish(job, "stopped", "stopped by request")
        return job

    # --- regrouping running jobs --------------------------------------------------------
    def regroup(self, job_id: str):
        """Bring a running job's GPUs under fewer switches; it stalls for the dark window and goes on.
        Returns the reconfiguration event, or None if its switch count cannot fall."""
        return self.regroup_with_note(job_id)[0]

    def regroup_with_note(self, job_id: str):
        """`regroup`, and what happened in words (e.g. "cannot fall below 2 switches")."""
        job = self.get(job_id)
        if job.state != "running":
            raise Conflict(f"{job_id} is {job.state}; only a running job can be regrouped")
        plans = []

        def plan(current: CircuitMap) -> CircuitMap | None:
            if job.state != "running":
                raise Conflict(f"{job_id} is {job.state}; only a running job can be regrouped")
            p = policy.plan_regroup(self.occ(current), job.gpus)
            plans.append(p)
            return p.target(current) if p.changes else None

        ev = self.ctx.ocs.change(
            plan,
            "regroup",
            lambda: f"{job.id}: regroup under {','.join(plans[-1].switches)}",
            job=job.id,
            wait=RECONFIG_WAIT,
            note=lambda: self._note(job, plans[-1].diff),
        )
        p = plans[-1]
        if ev is not None:
            job.switches, job.note = list(p.switches), f"regrouped: {p.note}"
            job.circuits = self._circuits_of(job)
            job.events.append(ev.id)
            self.save()
            LOG.info("%s regrouped under %s (%d circuit changes)", job.id, ",".join(p.switches), p.changes)
        return ev, p.note

    def _defrag_plan(self, current: CircuitMap) -> tuple[defrag.Defrag, dict]:
        """The joint regrouping of every running job, planned from `current`, and its description."""
        running = {j.id: j for j in self.jobs.values() if j.state == "running"}
        occ = self.occ(current)
        d = defrag.plan_defrag(occ, {j: job.gpus for j, job in running.items()})
        where = {g: occ.switch_of(g) for job in running.values() for g in job.gpus}
        made: dict[str, int] = {}
        for a, _ in d.add:
            made[a.device] = made.get(a.device, 0) + 1
        stall = max((self.ctx.ocs.drivers[o].switching_time_s(n) for o, n in made.items()), default=0.0)
        body = defrag.describe(
            self.ctx.rack,
            d,
            {j: job.gpus for j, job in running.items()},
            where,
            {j: job.request["workload"].get("model", "vgg16") for j, job in running.items()},
            {
                j: max(0, (job.request["workload"]["iterations"] or 0) - len(job.iterations()))
                for j, job in running.items()
            },
            stall,
        )
        return d, {"version": self.ctx.circuits_version, **body}

    @staticmethod
    def _moves(body: dict) -> tuple:
        """What a plan changes: the jobs it moves with their circuits, and every circuit."""
        return ([(m["job"], m["circuits_removed"], m["circuits_added"]) for m in body["jobs_moved"]], body["circuits"])

    def regroup_all(self, dry_run: bool = False, version: int | None = None) -> dict:
        """Defragment: one joint plan for all running jobs, applied in one bulk OCS change.

        `dry_run` returns the plan (with the circuit map's version) and changes nothing; `version`
        applies exactly the dry-run plan made from that version, or raises Conflict if the map
        or the running jobs changed since."""
        result: dict = {}
        decided: dict = {}

        def plan(current: CircuitMap) -> CircuitMap | None:
            d, body = self._defrag_plan(current)
            result.update(body)
            decided["defrag"] = d
            if dry_run:
                self._plans[body["version"]] = body
                while len(self._plans) > KEPT_PLANS:
                    self._plans.popitem(last=False)
                return None
            if version is not None:
                if version != self.ctx.circuits_version:
                    raise Conflict(
                        f"the circuit map is at version {self.ctx.circuits_version}, the plan was made "
                        f"from version {version}; make a new plan (dry_run=true)"
                    )
                if version not in self._plans:
                    raise Conflict(f"no plan was made from version {version}; make one first (dry_run=true)")
                if self._moves(self._plans[version]) != self._moves(body):
                    raise Conflict("the running jobs changed since the plan was made; make a new plan (dry_run=true)")
            return current.apply(d.diff) if d.changes else None

        def reason() -> str:
            return "defragment: " + ", ".join(
                f"{m['job']} {'+'.join(m['switches_before'])} -> {'+'.join(m['switches_after'])}"
                for m in result["jobs_moved"]
            )

        def note() -> str:
            gpus = [g for m in result["jobs_moved"] for g in self.jobs[m["job"]].gpus]
            moved = displaced(self.ctx.rack, decided["defrag"].diff, gpus)
            return "; ".join(moved) + " (no free switch port was left)" if moved else ""

        ev = self.ctx.ocs.change(plan, "regroup", reason, job=None, wait=RECONFIG_WAIT, note=note)
        if ev is not None:
            for m in result["jobs_moved"]:
                job = self.jobs[m["job"]]
                job.switches, job.note = (
                    m["switches_after"],
                    f"regrouped under {', '.join(m['switches_after'])} (defragmentation, event {ev.id})",
                )
                job.circuits = self._circuits_of(job)
                job.events.append(ev.id)
            self.save()
            LOG.info("%s (%d circuit changes, one reconfiguration)", ev.reason, result["circuits_changed"])
        result.update(
            applied=not dry_run, event=ev.to_json() if ev else None, circuits_version=self.ctx.circuits_version
        )
        if not dry_run:
            self._drain_queue()
        return result

    def fragmentation(self) -> dict:
        return policy.fragmentation(self.occ())

    # --- after a restart --------------------------------------------------------------------
    def _recover(self) -> None:
        """After a restart: follow running jobs whose workers are all still there, on every engine;
        fail the others; then remove what is left of jobs that are over."""
        # The states found at start: ending one job drains the queue, which admits queued jobs that must not be
        # taken for jobs the restart interrupted.
        found = [(job, job.state) for job in self.jobs.values() if job.state in ACTIVE]
        for job, state in found:
            if job.state != state:
                continue
            if job.state == "running":
                present = self._present(job)
                if set(present) == set(job.gpus):
                    LOG.info("%s: its workers are still there after the restart; following them again", job.id)
                    self.rt.spawn(self._watch, job)
                    continue
                missing = ", ".join(sorted(set(job.gpus) - set(present)))
                self._fail(job, f"the workers of {missing} went away while the controller was down", None)
            elif job.state in ACTIVE:
                self._fail(job, f"the controller restarted while the job was {job.state}", None)
        for server in self.ctx.rack.servers:
            self._sweep(server)

    def _present(self, job: Job) -> list[str]:
        """The GPUs of `job` whose worker is still on its server's engine: running, or exited while
        the controller was down (its exit code and output still say how it ended, and following it
        records that)."""
        found = []
        for server in sorted({self.ctx.rack.server_of[g] for g in job.gpus}):
            try:
                found += [w["gpu"] for w in self.driver.workers(server, job.id) if w["role"] == "worker"]
            except Exception as e:  # noqa: BLE001 (engine unreachable: its workers count as gone)
                LOG.error("cannot list containers on %s: %s", server, e)
        return found

    # --- the servers' engines -------------------------------------------------------------------
    def down_servers(self) -> dict[str, str]:
        """Servers whose Docker Engine did not answer when last asked: server -> why."""
        return self.driver.down_servers()

    def _watch_engines(self) -> None:
        """Ask every engine now and then; one that comes back gets its stale containers removed."""
        while True:
            self.rt.sleep(self.engine_poll)
            for server in self.ctx.rack.servers:
                was_down = server in self.driver.down_servers()
                if self.driver.engines.ping(server) and was_down:
                    self._sweep(server)
                    try:
                        self._drain_queue()  # its GPUs can take queued jobs again
                    except Exception:  # noqa: BLE001 (the watch goes on; the next job's end drains again)
                        LOG.exception("starting queued jobs after the engine of %s came back", server)

    def _sweep(self, server: str) -> None:
        keep = {j.id for j in self.jobs.values() if j.active}
        try:
            gone = self.driver.sweep(server, keep)
        except Exception as e:  # noqa: BLE001 (down again: the next poll retries)
            LOG.error("cannot remove stale containers on %s: %s", server, e)
            return
        if gone:
            LOG.warning("removed stale containers of GPUs %s on %s", ", ".join(gone), server)

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
from ryu.lib import hub

from controller.apps.context import Conflict, Optirack
from controller.apps.ocs import ReconfigFailed
from controller.config import conf
from controller.core import defrag
from controller.core import placement as policy
from controller.core.circuits import CircuitDiff, CircuitMap
from controller.core.jobs import ACTIVE, QUEUED, Job, JobRequest
from controller.core.occupancy import Occupancy
from controller.core.rack import PortRef
from controller.drivers.containers import (
    LABEL_JOB,
    ContainerDriver,
    ContainerError,
    GpuContainer,
    HostNicHome,
    container_name,
)
from controller.drivers.ocs import OcsUnavailable

LOG = logging.getLogger("optirack.placement")
RECONFIG_WAIT = 120.0  # seconds a job waits for another reconfiguration to finish
KEPT_PLANS = 8  # defragmentation plans remembered for `POST /regroup {"version": N}`


class UnknownJob(KeyError):
    pass


def _nic_home(rack):
    if conf().nic_home == "host":
        return HostNicHome()
    from emulation.nics import EmulatedNicHome

    return EmulatedNicHome(rack)


class PlacementApp(app_manager.RyuApp):
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: Optirack = kwargs["optirack"]
        self.ctx.placement = self
        self.driver = kwargs.get("driver") or ContainerDriver(self.ctx.rack, conf().worker_image, _nic_home(self.ctx.rack))
        self.jobs: dict[str, Job] = {j["id"]: Job.from_state(j) for j in self.ctx.saved.get("jobs", [])}
        start = max((int(j.split("-")[-1]) for j in self.jobs if j.split("-")[-1].isdigit()), default=0) + 1
        self._ids = itertools.count(start)
        self._admit = hub.Semaphore(1)  # admission (submit and the queue) one job at a time
        self.queue: collections.deque[str] = collections.deque(
            j.id for j in sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id)) if j.state == QUEUED)
        self.occupancy = Occupancy(self.ctx.rack, self.ctx.circuits, self.busy_gpus())
        self._plans: collections.OrderedDict[int, dict] = collections.OrderedDict()  # version -> dry-run plan
        self._threads: dict[str, list] = {}
        hub.spawn(self._recover)
        if self.queue:
            hub.spawn(self._drain_when_ready)

    # --- what other apps and the REST API ask ---------------------------------------
    def busy_gpus(self) -> dict[str, str]:
        return {g: j.id for j in self.jobs.values() if j.active for g in j.gpus or self._requested(j)}

    gpu_jobs = busy_gpus

    @staticmethod
    def _requested(job: Job) -> list[str]:
        gpus = job.request.get("gpus")
        return gpus if isinstance(gpus, list) else []

    def protected_ports(self, exclude: str | None = None) -> dict[PortRef, str]:
        """OCS ports of active jobs' GPUs and their circuits' other ends."""
        result = {}
        for job in self.jobs.values():
            if job.active and job.id != exclude:
                for g in job.gpus:
                    p = self.ctx.rack.gpu_port(g)
                    result[p] = job.id
                    other = self.ctx.circuits.partner(p)
                    if other is not None:
                        result[other] = job.id
        return result

    def get(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise UnknownJob(job_id)
        return self.jobs[job_id]

    def save(self) -> None:
        self.ctx.save(jobs=[j.to_state() for j in self.jobs.values()])

    # --- submitting, the queue, and placing --------------------------------------------
    def occ(self, circuits: CircuitMap | None = None, exclude: str | None = None) -> Occupancy:
        """The occupancy brought up to date with `circuits` (default: now) and the active jobs' GPUs."""
        holders = {g: j for g, j in self.busy_gpus().items() if j != exclude}
        self.occupancy.sync(self.ctx.circuits if circuits is None else circuits, holders)
        return self.occupancy

    @staticmethod
    def _request(job: Job, named: bool = False) -> policy.Request:
        r = job.request
        gpus = job.gpus if named else r["gpus"]
        return policy.Request(gpus if isinstance(gpus, int) else tuple(gpus), r["policy"], r.get("gpu_model"),
                              r["workload"].get("model", "vgg16"))

    def submit(self, req: JobRequest) -> Job:
        """Admit a job: placed at once (its GPUs reserved, started in the background), or queued.

        Raises policy.InvalidRequest (bad input), policy.NoRoomNow (cannot be placed now and
        `queue` is false) or policy.PlacementError (this rack can never place it); nothing changes then.
        """
        job = Job(id="", request=req.model_dump(), created_at=self.ctx.clock())
        with self._admit:
            try:
                p = policy.plan(self.occ(), self._request(job))
            except policy.NoRoomNow as e:
                p, wait = None, str(e)
            if p is not None and self.queue:
                p, wait = None, f"{len(self.queue)} queued job(s) ahead (first in, first out)"
            if p is None and not req.queue:
                raise policy.NoRoomNow(f"{wait}; not queued (queue: false)")
            job.id = f"job-{next(self._ids)}"
            self.jobs[job.id] = job
            if p is None:
                job.state, job.note = QUEUED, f"waiting: {wait}"
                self.queue.append(job.id)
                self._number_queue()
                self.save()
                LOG.info("%s queued at position %d: %s", job.id, job.position, wait)
            else:
                self._admit_job(job, p)
        return job

    def _admit_job(self, job: Job, p: policy.Plan) -> None:
        job.state, job.gpus, job.switches, job.note = "pending", list(p.gpus), list(p.switches), p.note
        self.save()
        LOG.info("%s admitted: %d GPUs %s, policy %s; %s", job.id, len(p.gpus), ",".join(p.gpus),
                 job.request["policy"], p.note)
        hub.spawn(self._run, job)

    def _number_queue(self) -> None:
        for i, job_id in enumerate(self.queue):
            self.jobs[job_id].position = i + 1

    def _drain_queue(self) -> None:
        """Start queued jobs, in order of arrival, while the first one can be placed."""
        with self._admit:
            while self.queue:
                job = self.jobs[self.queue[0]]
                try:
                    p = policy.plan(self.occ(), self._request(job))
                except policy.NoRoomNow as e:
                    job.note = f"waiting: {e}"
                    break
                except policy.PlacementError as e:  # the rack changed under it: it can never run
                    self.queue.popleft()
                    job.state, job.reason, job.ended_at, job.position = "failed", str(e), self.ctx.clock(), None
                    continue
                self.queue.popleft()
                job.position = None
                self._admit_job(job, p)
            self._number_queue()
            self.save()

    def _drain_when_ready(self, timeout: float = 60.0) -> None:
        """After a restart: start queued jobs once every OCS is back in sync (or after `timeout` s)."""
        waited = 0.0
        while self.ctx.ocs and set(self.ctx.ocs.synchronised) != set(self.ctx.rack.ocs) and waited < timeout:
            hub.sleep(0.2)
            waited += 0.2
        self._drain_queue()

    def _placement(self, job: Job) -> CircuitDiff | None:
        """Plan the job's circuits from the map the reconfiguration lock protects, and apply them."""
        plans = []

        def plan(current: CircuitMap) -> CircuitMap | None:
            p = policy.plan(self.occ(current, exclude=job.id), self._request(job, named=True))
            plans.append(p)
            return p.target(current) if p.changes else None

        ev = self.ctx.ocs.change(plan, "job", f"{job.id}: place {len(job.gpus)} GPUs ({job.request['policy']})",
                                 job=job.id, wait=RECONFIG_WAIT)
        p = plans[-1]
        job.gpus, job.switches = list(p.gpus), list(p.switches)
        if ev is None:
            return None
        job.events.append(ev.id)
        return p.diff

    def _run(self, job: Job) -> None:
        applied: CircuitDiff | None = None
        try:
            job.state = "configuring"
            self.save()
            applied = self._placement(job)
            job.circuits = self._circuits_of(job)
            self._start_containers(job)
        except (policy.PlacementError, ReconfigFailed, OcsUnavailable, Conflict, ContainerError) as e:
            self._fail(job, str(e), applied)
            return
        job.state, job.started_at = "running", self.ctx.clock()
        self.save()
        LOG.info("%s running on %s (switches %s)", job.id, ",".join(job.gpus), ",".join(job.switches))
        self._watch(job)

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
        cmd = ["--rank", str(rank), "--world-size", str(len(job.gpus)), "--master", master, "--mode", w["mode"],
               "--iterations", str(w["iterations"]), "--rate-scale", str(self.ctx.rack.spec.emulation.rate_scale),
               "--time-dilation", str(self.ctx.rack.spec.emulation.time_dilation),
               "--wait-for-nic", "60", "--batch", str(w["batch"])]
        if w["mode"] == "profile":
            cmd += ["--workload", w["model"]]
        if w.get("compute_seconds") is not None:
            cmd += ["--compute-seconds", str(w["compute_seconds"])]
        return cmd

    def _start_containers(self, job: Job) -> None:
        rack, prefix = self.ctx.rack, self.ctx.rack.spec.network.subnet.prefixlen
        started = []
        try:
            for rank, gpu in enumerate(job.gpus):
                g = rack.gpus[gpu]
                self.driver.start(GpuContainer(job.id, gpu, rack.server_of[gpu], g.index, g.model, rack.interface(gpu),
                                               f"{rack.addresses[gpu][0]}/{prefix}", self._command(job, rank)))
                started.append(gpu)
        except ContainerError:
            self._remove_containers(job, started)
            raise

    def _remove_containers(self, job: Job, gpus=None) -> None:
        for gpu in gpus if gpus is not None else job.gpus:
            try:
                self.driver.remove(job.id, gpu, self.ctx.rack.server_of[gpu], self.ctx.rack.interface(gpu))
            except Exception as e:  # noqa: BLE001 (keep cleaning the others)
                LOG.error("%s: removing the container of %s: %s", job.id, gpu, e)

    def _fail(self, job: Job, reason: str, applied: CircuitDiff | None) -> None:
        LOG.error("%s failed: %s", job.id, reason)
        if applied:
            self._reverse(job, applied)
        self._remove_containers(job)
        job.state, job.reason, job.ended_at = "failed", reason, self.ctx.clock()
        self.save()
        self._drain_queue()  # its GPUs are free

    def _reverse(self, job: Job, applied: CircuitDiff) -> None:
        """Put back the circuits this job's placement replaced, where nothing else has changed them."""
        current = self.ctx.circuits
        keep = [c for c in current.circuits if c not in applied.add]
        used = {p for c in keep for p in c}
        back = [c for c in applied.remove if not (set(c) & used)]
        try:
            ev = self.ctx.ocs.reconfigure(CircuitMap(keep + back), "job", f"{job.id}: undo placement", job=job.id,
                                          wait=RECONFIG_WAIT)
            job.events.append(ev.id)
        except (ReconfigFailed, OcsUnavailable, Conflict) as e:
            LOG.error("%s: could not restore the circuits: %s", job.id, e)

    # --- watching the workers ---------------------------------------------------------
    def _watch(self, job: Job) -> None:
        threads = [hub.spawn(self._follow, job, gpu) for gpu in job.gpus]
        self._threads[job.id] = threads
        hub.joinall(threads)
        if job.state != "running":
            return  # stopped or failed meanwhile
        failed = {g: c for g, c in job.exit_codes.items() if c != 0}
        if failed:
            gpu, code = next(iter(failed.items()))
            last = next((r for r in reversed(job.reports.get(gpu, [])) if r.get("event") == "error"), None)
            self._finish(job, "failed", f"the worker on {gpu} exited with {code}" + (f": {last['error']}" if last else ""))
        else:
            self._finish(job, "done", None)

    def _follow(self, job: Job, gpu: str) -> None:
        """Read one worker's JSON lines as they come; record its exit code; stop the job if it failed."""
        server = self.ctx.rack.server_of[gpu]
        try:
            container = self.driver.client_for(server).containers.get(container_name(job.id, gpu))
            job.reports[gpu] = []
            buf = b""
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=False):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.startswith(b"{"):
                        try:
                            job.record(gpu, json.loads(line))
                        except ValueError:
                            pass
            job.exit_codes[gpu] = container.wait().get("StatusCode", -1)
        except Exception as e:  # noqa: BLE001 (the container vanished or Docker failed)
            LOG.error("%s: lost the worker on %s: %s", job.id, gpu, e)
            job.exit_codes[gpu] = -1
        if job.exit_codes[gpu] != 0 and job.state == "running":
            LOG.warning("%s: the worker on %s exited with %s; stopping the others", job.id, gpu, job.exit_codes[gpu])
            for other in job.gpus:
                if other != gpu:
                    self._kill(job, other)

    def _kill(self, job: Job, gpu: str) -> None:
        try:
            self.driver.client_for(self.ctx.rack.server_of[gpu]).containers.get(container_name(job.id, gpu)).kill()
        except Exception:  # noqa: BLE001 (already gone)
            pass

    def _finish(self, job: Job, state: str, reason: str | None) -> None:
        self._remove_containers(job)
        job.state, job.reason, job.ended_at = state, reason, self.ctx.clock()
        self.save()
        completion = job.completion_s()
        LOG.info("%s %s%s", job.id, state, f" in {completion:.1f} s" if completion else f": {reason}" if reason else "")
        self._drain_queue()  # its GPUs are free

    def stop(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.state == QUEUED:
            with self._admit:
                self.queue.remove(job_id)
                job.state, job.reason, job.ended_at, job.position = "stopped", "stopped while queued", self.ctx.clock(), None
                self._number_queue()
                self.save()
            self._drain_queue()  # the next one may fit now
            return job
        if not job.active:
            return job
        if job.state != "running":
            raise Conflict(f"{job_id} is {job.state}; stop it once it runs")
        job.state, job.reason = "stopped", "stopped by request"
        for gpu in job.gpus:
            self._kill(job, gpu)
        hub.joinall(self._threads.get(job.id, []))
        self._finish(job, "stopped", "stopped by request")
        return job

    # --- regrouping running jobs --------------------------------------------------------
    def regroup(self, job_id: str):
        """Bring a running job's GPUs under fewer switches; it stalls for the dark window and goes on.
        Returns (event or None, note)."""
        job = self.get(job_id)
        if job.state != "running":
            raise Conflict(f"{job_id} is {job.state}; only a running job can be regrouped")
        plans = []

        def plan(current: CircuitMap) -> CircuitMap | None:
            p = policy.plan_regroup(self.occ(current), job.gpus)
            plans.append(p)
            return p.target(current) if p.changes else None

        ev = self.ctx.ocs.change(plan, "regroup", f"{job.id}: regroup", job=job.id, wait=RECONFIG_WAIT)
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
        body = defrag.describe(self.ctx.rack, d, {j: job.gpus for j, job in running.items()}, where,
                               {j: job.request["workload"].get("model", "vgg16") for j, job in running.items()},
                               {j: max(0, (job.request["workload"]["iterations"] or 0) - len(job.iterations()))
                                for j, job in running.items()}, stall)
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

        def plan(current: CircuitMap) -> CircuitMap | None:
            d, body = self._defrag_plan(current)
            result.update(body)
            if dry_run:
                self._plans[body["version"]] = body
                while len(self._plans) > KEPT_PLANS:
                    self._plans.popitem(last=False)
                return None
            if version is not None:
                if version != self.ctx.circuits_version:
                    raise Conflict(f"the circuit map is at version {self.ctx.circuits_version}, the plan was made "
                                   f"from version {version}; make a new plan (dry_run=true)")
                if version not in self._plans:
                    raise Conflict(f"no plan was made from version {version}; make one first (dry_run=true)")
                if self._moves(self._plans[version]) != self._moves(body):
                    raise Conflict("the running jobs changed since the plan was made; make a new plan (dry_run=true)")
            return current.apply(d.diff) if d.changes else None

        ev = self.ctx.ocs.change(plan, "regroup", "defragment", job=None, wait=RECONFIG_WAIT)
        if ev is not None:
            ev.reason = "defragment: " + ", ".join(f"{m['job']} {'+'.join(m['switches_before'])} -> "
                                                   f"{'+'.join(m['switches_after'])}" for m in result["jobs_moved"])
            for m in result["jobs_moved"]:
                job = self.jobs[m["job"]]
                job.switches, job.note = m["switches_after"], f"regrouped under {', '.join(m['switches_after'])} " \
                                                              f"(defragmentation, event {ev.id})"
                job.circuits = self._circuits_of(job)
                job.events.append(ev.id)
            self.save()
            LOG.info("%s (%d circuit changes, one reconfiguration)", ev.reason, result["circuits_changed"])
        result.update(applied=not dry_run, event=ev.to_json() if ev else None, circuits_version=self.ctx.circuits_version)
        if not dry_run:
            self._drain_queue()
        return result

    def fragmentation(self) -> dict:
        return policy.fragmentation(self.occ())

    # --- after a restart --------------------------------------------------------------------
    def _recover(self) -> None:
        for job in list(self.jobs.values()):
            if job.state == "running":
                present = self._present(job)
                if set(present) == set(job.gpus):
                    LOG.info("%s: still running after the restart; following its workers again", job.id)
                    hub.spawn(self._watch, job)
                    continue
                self._fail(job, "its containers went away while the controller was down", None)
            elif job.state in ACTIVE:
                self._fail(job, f"the controller restarted while the job was {job.state}", None)

    def _present(self, job: Job) -> list[str]:
        found = []
        for server in {self.ctx.rack.server_of[g] for g in job.gpus}:
            try:
                found += [c.labels.get("org.optirack.gpu") for c in self.driver.containers(server, job.id)
                          if c.labels.get(LABEL_JOB) == job.id]
            except Exception as e:  # noqa: BLE001 (Docker unreachable: treat as gone)
                LOG.error("cannot list containers on %s: %s", server, e)
        return found

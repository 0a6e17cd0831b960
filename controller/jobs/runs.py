"""A job's run: placed (circuits and forwarding, confirmed), its containers started, its workers followed, and its end
(done, failed with the reason, or stopped), with everything it held given back. Steps of the loop (loop.py): each
decides from the job's record and the book, and starts at most one action (actions.py) whose Done it takes next.

- pending: the placement and the containers' start, one action (`started` takes it): running, or the job fails with
  the reason and its circuits put back.
- configuring with no action in flight: the controller restarted while it was placed (`placed_found`): carried on to
  running if the devices hold its plan, else undone.
- running with no follower: the controller restarted (`adopted`): its workers still there are followed again; a
  worker that went away while the controller was down is a loss (the recovery takes it), not the job's end.
- a worker's lines are recorded (heartbeats only observed); its end: all ranks done is the job done; a failure is a
  `Lost` sign for the recovery (recovery.py).
- `End`: what the job holds is given back (an action: circuits put back, logs kept, containers and checkpoints
  removed), then its final state; queued jobs are tried again (`Drain`).
"""

from __future__ import annotations

from controller.core import placement as policy
from controller.core.cabling import CircuitError
from controller.core.circuits import CircuitDiff, CircuitMap
from controller.core.errors import Conflict, OcsUnavailable, ReconfigFailed
from controller.core.jobs import QUEUED, Job, transition
from controller.jobs import aggregation
from controller.jobs.actions import Actions
from controller.jobs.book import JobBook, line_key
from controller.jobs.inbox import Done, Drain, End, Inbox, Lost, Reconcile, Reply, WorkerEnded, WorkerLine
from controller.jobs.ports import AggregatorsPort, CircuitChangesPort, ContainersPort
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG, RECONFIG_WAIT, _reason, _unexpected, displaced_note, request_of
from controller.jobs.workers import Workers

DEVICES_WAIT = 60.0  # seconds a restarted controller waits for the OCS before it undoes a configuring job
KEPT_LINES = ("alive",)  # lines observed but not kept in the job's record (heartbeats)


class StartFailed(RuntimeError):
    """A placement or start that failed after changing circuits: the circuits to put back ride with the error."""

    def __init__(self, error: BaseException, undo: CircuitDiff | None):
        super().__init__(str(error))
        self.error, self.undo = error, undo


class Runs:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, changes: CircuitChangesPort,
                 containers: ContainersPort, hold_configuring: bool = False,
                 aggregators: AggregatorsPort | None = None):
        self.book, self.inbox, self.rt, self.changes = book, inbox, rt, changes
        self.aggregators = aggregators  # told when an aggregating job ends (None: its slots are freed when idle)
        self.workers = Workers(book, containers, inbox, rt)
        self.actions = Actions(book, inbox, rt)
        self.hold_configuring = hold_configuring  # a fault hook for tests: jobs stop at configuring (held)

    # --- reconciling ----------------------------------------------------------------------------
    def reconcile(self, job: Job) -> None:
        if self.actions.busy(job.id) or job.id in self.book.ending:
            return
        if job.state == "pending":
            self._place(job)
        elif job.state == "configuring":
            self.actions.start(job.id, "runs.placed_found", self._observe_placement, job)
        elif job.state == "running" and not any(k[0] == job.id for k in self.book.followers):
            self.actions.start(job.id, "runs.adopted", self.workers.present, job)

    def follow(self, job: Job, gpus: list[str]) -> None:
        """Follow the workers of `gpus` from now on (their ranks observed afresh)."""
        self.book.follow(job, gpus)
        for g in gpus:
            fid = self.book.followers[(job.id, g)] = next(self.book.fids)
            self.workers.follow(job, g, fid)

    # --- pending -> configuring -> running ---------------------------------------------------------
    def _place(self, job: Job) -> None:
        transition(job, "configuring")
        self.book.save()
        admitted = self.book.admitted.pop(job.id, None)
        self.actions.start(job.id, "runs.placed", self._change, job, admitted)

    def _change(self, job: Job, admitted: policy.Plan | None) -> dict:
        """The action: the job's circuits, planned under the reconfiguration lock for the GPUs admitted."""
        decided: dict = {}

        def plan(current: CircuitMap) -> CircuitMap:
            occ = self.book.occ(current, exclude=job.id)
            try:
                p = policy.plan(occ, request_of(job, named=True))
            except policy.NoRoomNow:  # its aggregator's switch no longer takes it: placed as any job (a ring)
                if aggregation.aggregating(job) is None:
                    raise
                p = policy.plan(occ, request_of(job, named=True, confined=False))
            decided.update(plan=p, diff=p.diff)
            return p.target(current)

        ev = self.changes.change(plan, "job", f"{job.id}: place {len(job.gpus)} GPUs ({job.request['policy']})",
                                 job=job.id, wait=RECONFIG_WAIT,
                                 note=lambda: displaced_note(self.book.rack, decided["diff"], job.gpus))
        return {"plan": decided["plan"], "event": ev, "undo": decided["diff"] if ev is not None else None,
                "admitted": admitted}

    def placed(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        if done.error is not None:  # nothing changed: rolled back, or refused
            self._failed(job, done.error, None)
            return
        p, ev = done.result["plan"], done.result["event"]
        job.gpus, job.switches = list(p.gpus), list(p.switches)
        aggregation.placed(job, p)
        if ev is not None:
            job.events.append(ev.id)
        if done.result["admitted"] is not None:
            job.note = policy.restated(done.result["admitted"], p)
        job.circuits = self.book.circuits_of(job)
        self.book.save()  # the plan that stands: what a restarted controller checks the devices against
        evict = [(g, self.book.warm.pop(g)) for g in job.gpus if g in self.book.warm]  # other jobs' warm spares
        for g, _ in evict:
            self.book.serves.pop(g, None)
        self.actions.start(job.id, "runs.started", self._start, job, evict, done.result["undo"])

    def _start(self, job: Job, evict: list[tuple[str, str]], undo: CircuitDiff | None) -> str:
        """The action: one container per GPU (all or nothing); held here by the test-only fault hook."""
        try:
            image = self.workers.start(job, job.gpus, evict=evict)
        except Exception as e:  # noqa: BLE001 (the job fails with the reason; its circuits go back)
            raise StartFailed(e, undo) from None
        while self.hold_configuring:
            LOG.warning("%s: held at configuring by --optirack-fault-hold-configuring", job.id)
            self.rt.sleep(3600)
        return image

    def _failed(self, job: Job, e: BaseException, undo: CircuitDiff | None) -> None:
        LOG.error("%s failed: %s", job.id, _reason(e), exc_info=e if _unexpected(e) else None)
        self.inbox.post(End(job.id, "failed", _reason(e), undo))

    def started(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        if done.error is not None:
            e = done.error
            cause, undo = (e.error, e.undo) if isinstance(e, StartFailed) else (e, None)
            self._failed(job, cause, undo)
            return
        job.image = done.result
        transition(job, "running", started_at=self.book.clock())
        self.book.save()
        LOG.info("%s running on %s (switches %s)", job.id, ",".join(job.gpus), ",".join(job.switches))
        self.follow(job, job.gpus)
        self.inbox.post(Reconcile(job.id))  # its warm spares

    # --- found after a restart ------------------------------------------------------------------------
    def _observe_placement(self, job: Job) -> str | None:
        """Why the devices do not hold `job`'s plan (None: they do); waits for the OCS first if it must undo."""
        why = None
        if not job.gpus or len(job.circuits) != len(job.gpus):
            why = "its placement had not been recorded"
        else:
            held = {frozenset(str(p) for p in c) for c in self.book.state.circuits.circuits}
            changed = [c for c in job.circuits if frozenset(c) not in held]
            missing = sorted(set(job.gpus) - set(self.workers.present(job)))
            if changed:
                why = f"its circuit {changed[0][0]}-{changed[0][1]} is gone"
            elif missing:
                why = f"the containers of {', '.join(missing)} are gone"
        if why is not None:
            waited = 0.0
            while not self.changes.ready() and waited < DEVICES_WAIT:
                self.rt.sleep(0.2)
                waited += 0.2
        return why

    def placed_found(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        why = done.result if done.error is None else f"they could not be checked ({done.error})"
        if why is None:
            LOG.info("%s: configuring at the restart, its circuits and containers in place: carrying on", job.id)
            transition(job, "running", started_at=self.book.clock())
            self.book.save()
            self.follow(job, job.gpus)
            return
        LOG.warning("%s: configuring at the restart, but %s: undoing it", job.id, why)
        self.inbox.post(End(job.id, "failed", f"the controller restarted while the job was configuring, and {why}",
                            self._placed(job)))

    def _placed(self, job: Job) -> CircuitDiff | None:
        """The circuits the job's placement changed, from its last placement event (None: it changed none)."""
        placed = [e for e in self.book.state.events.recent()
                  if e.job == job.id and e.kind == "job" and e.status == "ok"]
        if not placed:
            return None
        ev, rack = placed[-1], self.book.rack
        try:
            removed, added = CircuitMap.parse(rack, ev.removed), CircuitMap.parse(rack, ev.added)
        except CircuitError as e:  # the rack file changed since
            LOG.error("%s: its placement event no longer fits the rack (%s); circuits left as they are", job.id, e)
            return None
        return CircuitDiff(frozenset(removed.circuits), frozenset(added.circuits))

    def adopted(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        if job.state != "running":
            return
        present = [] if done.error is not None else done.result
        found = [g for g in job.gpus if g in present]
        if found:
            LOG.info("%s: the workers of %s are still there after the restart; following them again", job.id,
                     ", ".join(found))
        self.book.refollow(job, found)
        self.follow(job, found)
        for g in job.gpus:
            if g not in found:
                self.inbox.post(Lost(job.id, g, f"the worker of {g} went away while the controller was down", True,
                                     killed=True))  # its GPU is not known dead: it may take its rank again
        self.inbox.post(Reconcile(job.id))

    # --- the workers' words -----------------------------------------------------------------------------
    def line(self, ev: WorkerLine) -> None:
        job = self.book.jobs.get(ev.job)
        if job is None or self.book.followers.get((ev.job, ev.gpu)) != ev.fid or ev.gpu not in job.gpus:
            return  # a follower no longer current (its GPU swapped out, its attempt stopped), or a warm spare's
        line = {"attempt": job.attempt, **ev.line}
        replay = self.book.replay.get((ev.job, ev.gpu))
        if replay is not None and line_key(line) in replay:
            return  # a line recorded before a restart, read again from the start of the worker's output
        if line.get("event") not in KEPT_LINES:
            job.record(ev.gpu, line)
        if aggregation.reported(job, line):
            self.book.save()
        rank = self.book.rank(job, ev.gpu)
        if rank is None:
            return
        rank.alive_at = ev.at
        if line.get("event") == "iteration" and line.get("attempt") == job.attempt:
            rank.iteration, rank.iteration_at = int(line["iteration"]), ev.at
            rank.iter_s.append(float(line.get("iter_s", 0.0)))
            rank.compute_s.append(float(line.get("compute_s", 0.0)))

    def worker_ended(self, ev: WorkerEnded) -> None:
        job = self.book.jobs.get(ev.job)
        if job is None or self.book.followers.get((ev.job, ev.gpu)) != ev.fid:
            return
        del self.book.followers[(ev.job, ev.gpu)]
        if self.book.warm.get(ev.gpu) == ev.job:  # a warm spare that died: another is started in its place
            del self.book.warm[ev.gpu]
            self.book.serves.pop(ev.gpu, None)
            self.inbox.post(Reconcile(job.id))
            return
        if ev.gpu not in job.gpus or job.state not in ("running", "recovering") or job.id in self.book.ending:
            return
        rank = self.book.rank(job, ev.gpu)
        if rank is not None:
            rank.ended = True
        code = -1 if ev.code is None else ev.code
        job.exit_codes[ev.gpu] = code
        if code == 0:
            if job.state == "running" and all(job.exit_codes.get(g) == 0 for g in job.gpus):
                self.inbox.post(End(job.id, "done"))
            return
        why = ev.why
        last = next((r for r in reversed(job.reports.get(ev.gpu, [])) if r.get("event") == "error"), None)
        if last and last.get("error") not in why:
            why += f": {last['error']}"
        killed = ev.code is not None and ev.code > 128  # by a signal (kill -9, the OOM killer): its GPU is suspect
        self.inbox.post(Lost(job.id, ev.gpu, why, sure=ev.code is None or killed, killed=killed))

    # --- the end ------------------------------------------------------------------------------------------
    def stop(self, reply: Reply, job_id: str) -> None:
        """Stop a job: a queued one leaves the queue; a running or recovering one has its workers killed and ends
        `stopped` (answered once it has); an ended one is answered as it is. Conflict while it is being placed."""
        job = self.book.get(job_id)
        if job.state == QUEUED:
            self.book.queue.remove(job.id)
            transition(job, "stopped", reason="stopped while queued", ended_at=self.book.clock(), position=None)
            self.book.number_queue()
            self.book.save(job)
            self.inbox.post(Drain())
            reply.set(job)
            return
        if not job.active or job.id in self.book.ending:
            reply.set(job) if not job.active else self.book.ending[job.id].append(reply)
            return
        if job.state not in ("running", "recovering"):
            raise Conflict(f"{job.id} is {job.state}; stop it once it runs")
        self.book.stopping.add(job.id)  # its GPUs stay held until its containers are gone
        transition(job, "stopped", reason="stopped by request")
        self.book.awaiting.discard(job.id)
        self.end(End(job.id, "stopped", "stopped by request"), reply)

    def end(self, ev: End, reply: Reply | None = None) -> None:
        job = self.book.jobs.get(ev.job)
        if job is None or job.id in self.book.ending or not (job.active or job.id in self.book.stopping):
            if ev.reply is not None and job is not None:
                self.book.ending[job.id].append(ev.reply) if job.id in self.book.ending else ev.reply.set(job)
            return
        if self.actions.busy(job.id):  # its action (containers starting, a circuit change) ends first, then this
            self.book.deferred.setdefault(job.id, ev)
            self.book.waiting.setdefault(job.id, []).extend(r for r in (reply, ev.reply) if r is not None)
            return
        self.book.ending[job.id] = [r for r in (*self.book.waiting.pop(job.id, []), reply, ev.reply) if r is not None]
        self.book.awaiting.discard(job.id)
        for key in [k for k in self.book.followers if k[0] == job.id]:
            del self.book.followers[key]
        warm = [g for g, j in self.book.warm.items() if j == job.id]
        for g in warm:
            del self.book.warm[g]
            self.book.serves.pop(g, None)
        servers = {self.workers.server(g) for g in job.gpus}
        for r in job.recoveries:
            servers |= {self.workers.server(g) for g in r.get("lost", {})}
        left = [g for g in (job.recovery or {}).get("old_gpus", []) if g not in job.gpus]  # lost mid-recovery
        self.actions.start(job.id, "runs.torn_down", self._teardown, job, ev, warm + left, servers | {
            self.workers.server(g) for g in left})

    def _teardown(self, job: Job, ev: End, warm: list[str], servers: set[str]) -> End:
        """The action: circuits put back (if the End says), the workers' last lines kept, containers, warm spares (and
        what GPUs lost in a recovery under way left) and checkpoints removed (an engine that is down is swept when it
        is back); the aggregator of an aggregating job told that it is over, once its workers are gone (their slots
        are freed at once: workers killed never leave)."""
        if ev.undo is not None:
            self._reverse(job, ev.undo)
        if job.kind == "containers":
            self.workers.kill(job, job.gpus)
            job.logs.update(self.workers.tails(job, job.gpus))
            self.workers.remove(job, list(job.gpus))
            for g in warm:
                self.workers.remove_warm(g, job.id)
            self.workers.remove_volumes(job, servers)
        a = aggregation.aggregating(job)
        if a is not None and self.aggregators is not None:
            self.aggregators.end_aggregation(a["switch"], a["key"])
        return ev

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
        except (ReconfigFailed, OcsUnavailable, Conflict) as e:
            LOG.error("%s: could not restore the circuits: %s", job.id, e)

    def torn_down(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        ev: End = done.result if done.error is None else End(job.id, "failed", f"cleaning up failed: {done.error}")
        self.book.stopping.discard(job.id)
        transition(job, ev.state, reason=ev.reason, ended_at=self.book.clock(), recovery=None)
        self.book.save(job)
        completion = job.completion_s()
        LOG.info("%s %s%s", job.id, ev.state,
                 f" in {completion:.1f} s" if completion else f": {ev.reason}" if ev.reason else "")
        for reply in self.book.ending.pop(job.id, []):
            reply.set(job)
        self.inbox.post(Drain())  # its GPUs are free

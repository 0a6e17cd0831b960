"""Keeping a job running when it loses GPUs, by reconciling: its recovery is a persisted record (`job.recovery`), and
each event that names the job (a sign of a loss, an action's outcome, a tick, a restart) advances it one step from that
record, observing the world again at every step. A loss found at any step joins the recovery and the plan is made
again; a job fails only when it keeps losing workers (MAX_RECOVERIES), never because a step met a fault.

Signs (`Lost`, posted by runs.py, detect.py): a worker exited with an error of its own (not sure: its GPU may be fine),
or its GPU is lost (sure): its worker was killed by a signal or vanished, its server's engine is down or the server
hung, its NIC's link is down. The steps, each persisted before the next begins:

- detected: signs gather; on a sure one at once, else after SETTLE s.
- assessed: which GPUs are lost (sure signs, and every GPU of a server observed down or whose link is down), which may
  take their own rank again (spares.restartable: killed on a live server, once), the new attempt.
- swapped: spares chosen in the loop (the spare rule of controller/core/spares.py; reserved at once) and placed with
  the survivors in one circuit change (an action) that also takes the lost GPUs' circuits away, fencing them: a hung
  server that wakes cannot send on the new ring. No spare now: the job waits at the head of the queue.
- told: the survivors (and the warm spares taken) are told their ranks in the new ring (an action).
- restarting: the ranks that could not be told are started from the checkpoint in new containers (an action); then
  the job runs again, the record one of its `recoveries`.

Fencing: a GPU swapped out is no longer the job's; its follower is dropped, so nothing it prints is recorded; its
circuit is gone; its containers are removed once its server answers again (detect.py sweeps it before its GPUs are
free). A restarted controller carries a recovery on from the record, observing first (the OCS, the engines, which
of the job's workers still run: those are followed again and told, the rest start cold): no step it finds is trusted."""

from __future__ import annotations

from typing import Any, cast

from controller.core import placement as policy
from controller.core import spares as spare_rule
from controller.core.circuits import CircuitMap
from controller.core.errors import Busy, OcsUnavailable
from controller.core.jobs import Job, transition
from controller.jobs import aggregation, assess
from controller.jobs.actions import Actions
from controller.jobs.book import JobBook
from controller.jobs.inbox import Done, Drain, End, Inbox, Lost, Reconcile
from controller.jobs.ports import AggregatorsPort, CircuitChangesPort, ContainersPort
from controller.jobs.rejoin import Rejoin
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG, RECONFIG_WAIT, _reason, _unexpected
from controller.jobs.workers import Workers

SETTLE = 0.3  # at most this long a recovery waits for a sure sign when its first one is not (a worker's own error)
WAIT_POLL = 0.5  # seconds between two tries of a job waiting for spares, or retrying a step the devices refused
MAX_RECOVERIES = 5  # a job that keeps losing workers fails after this many recoveries, with the last reason
MAX_TRIES = 5  # a step that fails this many times with no new loss to explain it fails the job
DEVICES_WAIT = 60.0  # seconds a step waits for the OCS to be reachable (after a restart) before the job fails
STEPS = ("detected", "assessed", "swapped", "told", "restarting")


class Recovery(Rejoin):
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, changes: CircuitChangesPort,
                 containers: ContainersPort, hold_at: str | None = None, keep_survivors: bool = True,
                 aggregators: AggregatorsPort | None = None):
        self.book, self.inbox, self.rt, self.changes, self.containers = book, inbox, rt, changes, containers
        self.aggregators = aggregators  # told that an aggregating job's old attempt is over (its pool freed)
        self.workers = Workers(book, containers, inbox, rt)
        self.actions = Actions(book, inbox, rt)
        self.hold_at = hold_at  # a fault hook for tests: a recovery stops once this step is recorded
        self.keep_survivors = keep_survivors  # survivors regroup in their processes (False: restarted)

    # --- signs ----------------------------------------------------------------------------------
    def lost(self, ev: Lost) -> None:
        job = self.book.jobs.get(ev.job)
        if job is None or job.id in self.book.ending or ev.gpu not in job.gpus:
            return
        sign = [ev.why, ev.sure, ev.killed]
        if job.state == "running":
            if len(job.recoveries) >= MAX_RECOVERIES:
                LOG.error("%s: %s, after %d recoveries: not recovering it again", job.id, ev.why, len(job.recoveries))
                self.inbox.post(End(job.id, "failed", f"{ev.why} (after {len(job.recoveries)} recoveries)"))
                return
            rec = {"step": "detected", "detected_at": self.book.clock(), "signs": {ev.gpu: sign},
                   "old_gpus": list(job.gpus), "replans": 0, "tries": 0}
            transition(job, "recovering", reason=ev.why, recovery=rec)
            LOG.warning("%s recovering: %s", job.id, ev.why)
            self.book.save()
            self.inbox.post(Reconcile(job.id))  # after the signs already in the inbox: they join this one
            return
        elif job.state == "recovering" and job.recovery is not None:
            old = job.recovery["signs"].get(ev.gpu)
            if old is None or (ev.sure and not old[1]):
                job.recovery["signs"][ev.gpu] = sign
        else:
            return
        self.reconcile(job)

    def tick(self, _=None) -> None:
        for job in [j for j in self.book.jobs.values() if j.state == "recovering"]:
            self.reconcile(job)

    def drain(self, _=None) -> None:
        """GPUs may be free: a job waiting for spares tries again."""
        for job_id in sorted(self.book.awaiting):
            self.reconcile(self.book.jobs[job_id])

    def resume(self, job: Job) -> None:
        """After a restart: observe the job's servers first, then carry its recovery on, every rank restarted."""
        rec = job.recovery or {"step": "detected", "detected_at": self.book.clock(), "signs": {}}
        rec.update(resumed=True, tries=0)
        if rec.get("step") == "assessed":
            aggregation.release(job)  # a swap under way when the controller stopped: its room is chosen again
        rec.setdefault("old_gpus", list(job.gpus))
        job.recovery = rec
        LOG.warning("%s: recovering at the restart (step %s): observing its servers again", job.id, rec["step"])
        self.actions.start(job.id, "recovery.observed", self._probe, job)

    # --- the reconciler ---------------------------------------------------------------------------
    def reconcile(self, job: Job) -> None:
        """One step of the job's recovery, from its record and what is observed now."""
        rec = job.recovery
        if job.state != "recovering" or rec is None or self.actions.busy(job.id) or job.id in self.book.ending:
            return
        if job.id in self.book.resuming:
            self.book.resuming.discard(job.id)
            return self.resume(job)
        if rec["step"] == self.hold_at and not rec.get("resumed"):
            if not rec.get("held"):  # held by the fault hook, as if the controller died here
                rec["held"] = True
                LOG.warning("%s: recovery held at step %s by the fault hook", job.id, rec["step"])
            return
        step = rec["step"]
        if step == "detected":
            sure = any(sign[1] for sign in rec["signs"].values())
            if not sure and not rec.get("settled") and self.book.clock() - rec["detected_at"] < SETTLE:
                return  # a worker's error of its own may follow another's loss: wait for a sure sign
            self._assess(job, rec)
            return self.reconcile(job)
        new = self._newly_lost(job, rec)
        if new:
            if step != "assessed":
                LOG.warning("%s: %s lost at step %s: planning the recovery again", job.id, ", ".join(new), step)
                rec["replans"] = rec.get("replans", 0) + 1
            self._assess(job, rec)
            return self.reconcile(job)
        waiting = job.id in self.book.awaiting or "devices_since" in rec
        if waiting and self.book.clock() - rec.get("tried_at", 0.0) < WAIT_POLL:
            return
        if step == "assessed":
            self._swap(job, rec)
        elif step == "swapped":
            self._tell(job, rec)
        elif step in ("told", "restarting"):
            self._restart(job, rec)

    def _down(self) -> dict[str, str]:
        return {**self.containers.down_servers(), **self.book.down}

    def _losses(self, job: Job, rec: dict) -> dict[str, str]:
        return assess.losses(job, rec, self.book.rack, self._down(), self.book.links_down)

    def _newly_lost(self, job: Job, rec: dict) -> list[str]:
        return assess.newly_lost(job, rec, self.book.rack, self._down(), self.book.links_down)

    def _assess(self, job: Job, rec: dict) -> None:
        """Which GPUs are lost now, which may be their own spare, the new attempt: the plan from here."""
        assess.assess(job, rec, self.book.rack, self._down(), self.book.links_down, self.book.clock())
        self.book.save()
        LOG.warning("%s: assessed: lost %s; attempt %d", job.id, ", ".join(rec["losing"]) or "none", rec["attempt"])

    def _kept(self, job: Job, rec: dict) -> list[str]:
        """The GPUs whose workers keep their processes: not lost, no error of their own, on a live server, and after a
        restart still running (none where survivors are restarted)."""
        if not self.keep_survivors:
            return []
        alive = rec.get("alive") if rec.get("resumed") else None  # after a restart: those still running only
        return [g for g in rec["old_gpus"] if g not in rec["losing"] and g not in rec["errors"]
                and self.book.rack.server_of[g] not in rec["servers_down"] and (alive is None or g in alive)]

    # --- swapped: spares chosen and placed in one circuit change ------------------------------------------
    def _swap(self, job: Job, rec: dict) -> None:
        rack, losing, own = self.book.rack, rec["losing"], rec["restartable"]
        kept = self._kept(job, rec)
        stop = [g for g in rec["old_gpus"] if g not in kept and rack.server_of[g] not in rec["servers_down"]]
        for g in rec["old_gpus"]:
            if g not in kept:
                self.book.followers.pop((job.id, g), None)  # a worker of an attempt the recovery stops
        job.attempt = rec["attempt"]
        job.gpus = [g for g in rec["old_gpus"] if g not in losing or g in own]  # the lost GPUs are no longer the job's
        down = set(self._down())
        others = {g for g, holder in self.book.busy_gpus().items() if holder != job.id}  # its own last try's spares
        taken = others | set(rec["old_gpus"]) | set(self.book.unlinked())  # are free to it again
        free = [g for g in rack.gpus if g not in taken and rack.server_of[g] not in down]
        where = {g: at[0] for g, at in self.book.state.circuits.gpu_locations(rack).items() if at}
        try:
            spares = spare_rule.choose(rack, list(losing), free, job.request["workload"].get("model", "vgg16"),
                                       job.switches, where, job.request.get("gpu_model"), own=own)
        except spare_rule.NoRoomNow as e:
            self._wait(job, rec, str(e))
            if not rec.get("stopped"):  # the old attempt's workers stop while it waits
                rec["stopped"] = True
                self.actions.start(job.id, "recovery.stopped", self.workers.kill, job, stop)
            return
        rec["spares"] = {g: s for g, s in spares.items() if s != g}  # reserved from here (book.busy_gpus)
        rec["restarted"] = {g: losing[g] for g, s in spares.items() if s == g}
        gpus = [g for g in rec["old_gpus"] if g not in losing or spares[g] == g] + list(rec["spares"].values())
        fence = [g for g in losing if g not in rec["restarted"]]
        gone = [g for g in fence if rack.server_of[g] not in down]  # lost on a live server: its containers go
        rec["swap_started"] = self.book.clock()
        req = policy.Request(tuple(gpus), "regroup", job.request.get("gpu_model"),
                             job.request["workload"].get("model", "vgg16"))
        if aggregation.asks(job):  # its new attempt's room chosen and reserved here, on the loop, as admission does
            aggregation.choose(self.book, self.book.occ(exclude=job.id, down=down), job, req)
            self.book.save()
        self.actions.start(job.id, "recovery.swapped", self._change, job, rec, req, rec.get("room"), fence, stop, gone)

    def _change(self, job: Job, rec: dict, req: policy.Request, room: dict | None, fence: list[str], stop: list[str],
                gone: list[str]):
        """The action: the old attempt's workers stopped; one circuit change placing `req`'s GPUs under as few switches
        as can be (an aggregating job's under the switch whose aggregator's room was chosen for it, else as a ring:
        controller/jobs/aggregation.py) and taking the circuits of the GPUs fenced out; the old attempt's pool freed at
        its aggregator; their containers removed where their server lives."""
        self.workers.kill(job, stop)
        rack, decided = self.book.rack, dict[str, Any]()
        ports = {rack.gpu_port(g) for g in fence}

        def plan(current: CircuitMap) -> CircuitMap:
            occ = self.book.occ(current, exclude=job.id, down=self._down())
            p, agg = aggregation.place(occ, req, room)
            decided.update(plan=p, aggregation=agg, planned_at=self.book.clock())
            target = p.target(current)
            return CircuitMap([c for c in target.circuits if not (set(c) & ports)])

        t0 = self.book.clock()
        ev = self.changes.change(plan, "failover", lambda: f"{job.id}: " + ", ".join(
            f"{a} -> {rec['spares'].get(a, a)}" for a in rec["losing"]) + " (lost)", job=job.id, wait=RECONFIG_WAIT,
            note=lambda: aggregation.failover_note(job.aggregation, decided["aggregation"]))
        old = aggregation.aggregating(job)
        if old is not None and self.aggregators is not None:  # the old attempt's pool: the new one joins afresh
            self.aggregators.end_aggregation(old["switch"], old["key"])
        if gone:
            self.rt.spawn(self.workers.remove, job, gone)
        return {"plan": decided["plan"], "event": ev, "gpus": list(cast(tuple, req.gpus)), "t0": t0,
                "t1": decided["planned_at"], "aggregation": decided["aggregation"]}

    def stopped(self, done: Done) -> None:
        self.reconcile(self.book.jobs[done.job])

    def swapped(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        rec = job.recovery
        if job.state != "recovering" or rec is None:
            return
        if done.error is not None:
            aggregation.release(job)  # the room chosen for it: chosen again at the next try
            return self._failed_step(job, rec, "swapping spares in", done.error)
        p, ev = done.result["plan"], done.result["event"]
        job.gpus, job.switches = list(done.result["gpus"]), list(p.switches)
        if aggregation.asks(job):  # the new attempt's room (reserved when chosen) now the record's
            rec["aggregation"] = aggregation.failover_note(job.aggregation, done.result["aggregation"])
            job.aggregation = done.result["aggregation"]
            rec.pop("room", None)
        if ev is not None:
            job.events.append(ev.id)
        job.circuits = self.book.circuits_of(job)
        now = self.book.clock()
        rec.pop("devices_since", None)
        rec.update(step="swapped", tries=0, event=ev.id if ev is not None else None, switches=list(p.switches),
                   planning_s=done.result["t1"] - rec.pop("swap_started", done.result["t1"]),
                   ocs_s=now - done.result["t1"], planned_at=now)  # planned: spares chosen and placed
        self.book.save()
        if job.id in self.book.awaiting:  # it held the queue back: with its spares taken, the others may go
            self.book.awaiting.discard(job.id)
            self.inbox.post(Drain())
        self.reconcile(job)

    def _wait(self, job: Job, rec: dict, why: str) -> None:
        """No spare now: wait at the head of the queue, checkpoint kept, and try again when GPUs may be free."""
        rec["tried_at"] = self.book.clock()
        if job.id not in self.book.awaiting:
            LOG.warning("%s: no spare GPU now (%s); waiting at the head of the queue", job.id, why)
            self.book.awaiting.add(job.id)
            job.note = f"recovering: waiting at the head of the queue for spares: {why}"
            rec["waited_from"] = self.book.clock()
            self.book.save()

    def _failed_step(self, job: Job, rec: dict, what: str, e: BaseException) -> None:
        """A step's action failed: observe the job's servers again (a new loss explains it, and the plan is made again);
        a step that keeps failing with none fails the job; no spare now is a wait."""
        if isinstance(e, policy.NoRoomNow):
            self._wait(job, rec, str(e))
            return
        now = self.book.clock()
        if isinstance(e, (OcsUnavailable, Busy)) and now - rec.setdefault("devices_since", now) < DEVICES_WAIT:
            rec["tried_at"] = now  # the OCS not connected yet (a restart), or another change: tried again shortly
            LOG.warning("%s: %s: %s; trying again", job.id, what, e)
            return
        rec["tries"] = rec.get("tries", 0) + 1
        LOG.warning("%s: %s failed (%s), try %d: observing its servers again", job.id, what, _reason(e), rec["tries"])
        if rec["tries"] >= MAX_TRIES or (_unexpected(e) and not isinstance(e, (OSError, RuntimeError))):
            LOG.error("%s: the recovery failed: %s", job.id, e, exc_info=_unexpected(e))
            self.inbox.post(End(job.id, "failed", f"{job.reason}; recovering failed: {_reason(e)}"))
            return
        self.actions.start(job.id, "recovery.observed", self._probe, job)

    def _probe(self, job: Job) -> dict:
        """The action: ask the engine of every server the job holds or held now: {"down": server -> why it is down
        (None: up), "alive": the GPUs whose worker of the job runs, after a restart}. After a restart it first waits
        (at most DEVICES_WAIT s) for the OCS to be back in step."""
        waited = 0.0
        while (job.recovery or {}).get("resumed") and not self.changes.ready() and waited < DEVICES_WAIT:
            self.rt.sleep(0.2)
            waited += 0.2
        rack = self.book.rack
        servers = {rack.server_of[g] for g in job.gpus + (job.recovery or {}).get("old_gpus", [])}
        out: dict[str, str | None] = {}
        for s in sorted(servers):
            out[s] = None if self.containers.engines.ping(s) else self.containers.down_servers().get(s, "down")
        rec = job.recovery or {}
        mine = set(job.gpus) | set(rec.get("old_gpus", [])) | set(rec.get("spares", {}).values())
        alive = self.workers.running(job, [g for g in mine if out[rack.server_of[g]] is None]) if rec.get(
            "resumed") else []
        return {"down": out, "alive": alive}

    def observed(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        result = done.result or {"down": {}, "alive": []}
        for server, why in result["down"].items():
            if why is not None:
                self.book.down.setdefault(server, why)
        rec = job.recovery
        if rec is not None and rec.get("resumed") and "alive" not in rec:  # after a restart: its workers still there
            alive = [g for g in result["alive"] if (job.id, g) not in self.book.followers]
            rec["alive"] = sorted(result["alive"])
            if alive:
                LOG.info("%s: the workers of %s still run after the restart: followed again, kept in their processes",
                         job.id, ", ".join(alive))
            self.book.refollow(job, alive)
            for g in alive:
                fid = self.book.followers[(job.id, g)] = next(self.book.fids)
                self.workers.follow(job, g, fid)
            rec["settled"] = True  # a restart settles nothing: go on
        self.reconcile(job)

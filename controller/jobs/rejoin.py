"""A recovery's last steps (controller/jobs/recovery.py): every rank in the new ring. `told`: the survivors (and the
warm spares taken) are told their ranks in the new ring; `restarting`: the ranks that could not be told start from the
checkpoint in new containers; then the job runs again, the record one of its `recoveries`. A mixin of Recovery: it
uses the recovery's book, workers, actions and reconciler."""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.core.jobs import Job, transition
from controller.jobs.inbox import Done, Reconcile
from controller.jobs.restores import newest_checkpoint, restores_for
from controller.jobs.steps import LOG

if TYPE_CHECKING:
    from controller.jobs.actions import Actions
    from controller.jobs.book import JobBook
    from controller.jobs.inbox import Inbox
    from controller.jobs.workers import Workers


class Rejoin:
    if TYPE_CHECKING:  # what the mixin uses of Recovery (controller/jobs/recovery.py), for the type checker
        book: JobBook
        inbox: Inbox
        workers: Workers
        actions: Actions
        hold_at: str | None

        def reconcile(self, job: Job) -> None: ...

        def _failed_step(self, job: Job, rec: dict, what: str, e: BaseException) -> None: ...

        def _kept(self, job: Job, rec: dict) -> list[str]: ...

    # --- told, restarting: every rank in the new ring -----------------------------------------------
    def _tell(self, job: Job, rec: dict) -> None:
        restores = restores_for(job, self.book.rack, [g for g in job.gpus if g in rec["old_gpus"]])
        rec["restores"] = {g: list(r) for g, r in restores.items()}
        warm = [s for s in rec["spares"].values() if self.book.warm.get(s) == job.id]
        for s in warm:  # its warm spare is one of its ranks from here
            del self.book.warm[s]
            self.book.serves.pop(s, None)
        if rec.get("resumed"):  # after a restart: a spare whose worker still runs (warm, or told before) is told too
            warm += [s for s in rec["spares"].values() if s in rec.get("alive", []) and s not in warm]
        told = [g for g in self._kept(job, rec) if g in job.gpus] + warm
        rec["warm_told"] = warm
        self.actions.start(job.id, "recovery.told", self.workers.regroup, job, told, restores, self.book.clock)

    def told(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        rec = job.recovery
        if job.state != "recovering" or rec is None:
            return
        took = done.result or {}
        kept = [g for g, t in took.items() if t is not None]
        rec.update(step="told", tries=0, told_s={g: round(t, 4) for g, t in took.items() if t is not None},
                   kept_now=kept)
        self.book.follow(job, kept)  # observed afresh in the new attempt; the survivors keep their followers
        for g in [g for g in kept if (job.id, g) not in self.book.followers]:  # a warm spare told its rank
            fid = self.book.followers[(job.id, g)] = next(self.book.fids)
            self.workers.follow(job, g, fid)
        self.book.save()
        self.reconcile(job)

    def _restart(self, job: Job, rec: dict) -> None:
        kept = [g for g in rec.get("kept_now", []) if (job.id, g) in self.book.followers]
        cold = [g for g in job.gpus if g not in kept]
        rec.update(step="restarting", kept_now=kept)
        self.book.save()
        if self.hold_at == "restarting" and not rec.get("resumed"):
            return self.reconcile(job)  # held (and said so) by the fault hook
        for g in cold:
            self.book.followers.pop((job.id, g), None)
        if cold:
            LOG.warning("%s: starting %s from the checkpoint in new containers", job.id, ", ".join(cold))
        restores = {g: tuple(r) for g, r in rec.get("restores", {}).items()}
        evict = [(g, self.book.warm.pop(g)) for g in cold if g in self.book.warm]  # another job's warm spare
        for g, _ in evict:
            self.book.serves.pop(g, None)
        self.actions.start(job.id, "recovery.restarted", self.workers.start, job, cold, restores, True, evict)

    def restarted(self, done: Done) -> None:
        job = self.book.jobs[done.job]
        rec = job.recovery
        if job.state != "recovering" or rec is None:
            return
        if done.error is not None:
            return self._failed_step(job, rec, "starting the containers", done.error)
        job.image = done.result or job.image
        kept = rec.pop("kept_now", [])
        cold = [g for g in job.gpus if g not in kept]
        self.book.follow(job, cold)
        for g in cold:
            fid = self.book.followers[(job.id, g)] = next(self.book.fids)
            self.workers.follow(job, g, fid)
        self._record(job, rec, kept)

    def _record(self, job: Job, rec: dict, kept: list[str]) -> None:
        now, warm = self.book.clock(), rec.pop("warm_told", [])
        # the checkpoint the ranks were told (_tell), not the newest held now: they may have saved newer ones since
        told = [r[0] for r in rec.get("restores", {}).values()]
        k = max(told, default=0) if "restores" in rec else \
            newest_checkpoint(job, self.book.rack, [g for g in job.gpus if g in rec["old_gpus"]])[0]
        done = {key: rec[key] for key in ("attempt", "reason", "detected_at", "restartable", "errors",
                                          "servers_down", "reached", "spares", "restarted", "planning_s", "ocs_s",
                                          "event", "switches", "planned_at", "told_s", "aggregation") if key in rec}
        done.update(lost=rec["lost"], kept=[g for g in kept if g not in warm],
                    warm={s: s in kept for s in rec["spares"].values()}, resumed_from=k,
                    iterations_redone=max(0, rec["reached"] - k), containers_s=now - rec.get("planned_at", now),
                    running_at=now, gpus=list(job.gpus), replans=rec.get("replans", 0))
        if rec.get("resumed"):
            done["resumed"] = True
        if "waited_from" in rec:  # it waited for spares at the head of the queue from then
            done["waited_from"] = rec["waited_from"]
        job.recoveries.append(done)
        swapped = ", ".join([f"{a} -> {b}" + ("" if done["warm"][b] else " (no warm spare: a container started)")
                             for a, b in done["spares"].items()]
                            + [f"{g} restarted on its own GPU" for g in done["restarted"]]) or "none swapped"
        job.note = f"recovered {len(job.recoveries)} time(s); last: {swapped}, from iteration {k}" + (
            f"; {rec['aggregation']}" if rec.get("aggregation") else "")
        job.exit_codes = {}
        transition(job, "running", reason=None, recovery=None)
        self.book.save()
        self.inbox.post(Reconcile(job.id))  # a warm spare again, for the next loss
        LOG.info("%s running again (%s) from iteration %d, %d redone; %d rank(s) kept their processes", job.id,
                 swapped, k, done["iterations_redone"], len(kept))

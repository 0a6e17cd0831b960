"""Regrouping: one running job under fewer switches, or every running job at once in one bulk OCS change
(defragmentation). Steps of the loop: the call is checked in the loop, the circuit change is an action (untracked:
a recovery of the job is not held up by it; the plan, made under the reconfiguration lock, refuses a job that no
longer runs), and its outcome updates the jobs and answers the caller.
"""

from __future__ import annotations

import collections

from controller.core import defrag
from controller.core import placement as policy
from controller.core.circuits import CircuitMap
from controller.core.errors import Conflict
from controller.jobs.actions import Actions
from controller.jobs.book import JobBook
from controller.jobs.inbox import Done, Drain, Inbox, Reply
from controller.jobs.ports import CircuitChangesPort
from controller.jobs.runtime import Runtime
from controller.jobs.steps import KEPT_PLANS, LOG, RECONFIG_WAIT, displaced_note


class Regroup:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, changes: CircuitChangesPort):
        self.book, self.inbox, self.changes = book, inbox, changes
        self.state = book.state
        self.actions = Actions(book, inbox, rt)
        self._plans: collections.OrderedDict[int, dict] = collections.OrderedDict()  # version -> dry-run plan

    def regroup(self, reply: Reply, job_id: str) -> None:
        """Bring a running job's GPUs under fewer switches; it stalls for the dark window and goes on. Answers (the
        reconfiguration event or None if its switch count cannot fall, what happened in words)."""
        job = self.book.get(job_id)
        if job.state != "running":
            raise Conflict(f"{job_id} is {job.state}; only a running job can be regrouped")
        self.actions.start(job.id, "regroup.regrouped", self._regroup, job, reply, tracked=False)

    def _regroup(self, job, reply: Reply) -> tuple:
        try:
            return reply, *self._change(job), None
        except Exception as e:  # noqa: BLE001 (the caller's answer)
            return reply, None, None, e

    def _change(self, job) -> tuple:
        plans: list = []

        def plan(current: CircuitMap) -> CircuitMap | None:
            if job.state != "running":
                raise Conflict(f"{job.id} is {job.state}; only a running job can be regrouped")
            p = policy.plan_regroup(self.book.occ(current), job.gpus)
            plans.append(p)
            return p.target(current) if p.changes else None

        ev = self.changes.change(
            plan,
            "regroup",
            lambda: f"{job.id}: regroup under {','.join(plans[-1].switches)}",
            job=job.id,
            wait=RECONFIG_WAIT,
            note=lambda: displaced_note(self.state.rack, plans[-1].diff, job.gpus),
        )
        return plans[-1], ev

    def regrouped(self, done: Done) -> None:
        reply, p, ev, error = done.result
        if error is not None:
            reply.fail(error)
            return
        job = self.book.jobs[done.job]
        if ev is not None:
            job.switches, job.note = list(p.switches), f"regrouped: {p.note}"
            job.circuits = self.book.circuits_of(job)
            job.events.append(ev.id)
            self.book.save()
            LOG.info("%s regrouped under %s (%d circuit changes)", job.id, ",".join(p.switches), p.changes)
        reply.set((ev, p.note))

    def _defrag_plan(self, current: CircuitMap) -> tuple[defrag.Defrag, dict]:
        """The joint regrouping of every running job, planned from `current`, and its description."""
        running = {j.id: j for j in self.book.jobs.values() if j.state == "running"}
        occ = self.book.occ(current)
        d = defrag.plan_defrag(occ, {j: job.gpus for j, job in running.items()})
        where = {g: occ.switch_of(g) for job in running.values() for g in job.gpus}
        made: dict[str, int] = {}
        for a, _ in d.add:
            made[a.device] = made.get(a.device, 0) + 1
        stall = max((self.changes.switching_time_s(o, n) for o, n in made.items()), default=0.0)
        body = defrag.describe(
            self.state.rack,
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
        return d, {"version": self.state.circuits_version, **body}

    @staticmethod
    def _moves(body: dict) -> tuple:
        """What a plan changes: the jobs it moves with their circuits, and every circuit."""
        return ([(m["job"], m["circuits_removed"], m["circuits_added"]) for m in body["jobs_moved"]], body["circuits"])

    def regroup_all(self, reply: Reply, dry_run: bool = False, version: int | None = None) -> None:
        """Defragment: one joint plan for all running jobs, applied in one bulk OCS change; answers its description.

        `dry_run` answers the plan (with the circuit map's version) and changes nothing; `version`
        applies exactly the dry-run plan made from that version, or refuses (Conflict) if the map
        or the running jobs changed since."""
        self.actions.start("defrag", "regroup.defragmented", self._defrag, reply, dry_run, version, tracked=False)

    def _defrag(self, reply: Reply, dry_run: bool, version: int | None) -> tuple:
        try:
            return reply, *self._defrag_change(dry_run, version), None
        except Exception as e:  # noqa: BLE001 (the caller's answer)
            return reply, None, None, e

    def _defrag_change(self, dry_run: bool, version: int | None) -> tuple:
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
                if version != self.state.circuits_version:
                    raise Conflict(
                        f"the circuit map is at version {self.state.circuits_version}, the plan was made "
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
            gpus = [g for m in result["jobs_moved"] for g in self.book.jobs[m["job"]].gpus]
            return displaced_note(self.state.rack, decided["defrag"].diff, gpus)

        ev = self.changes.change(plan, "regroup", reason, job=None, wait=RECONFIG_WAIT, note=note)
        result.update(applied=not dry_run, event=ev.to_json() if ev else None)
        return result, ev

    def defragmented(self, done: Done) -> None:
        reply, result, ev, error = done.result
        if error is not None:
            reply.fail(error)
            return
        if ev is not None:
            for m in result["jobs_moved"]:
                job = self.book.jobs[m["job"]]
                job.switches, job.note = (
                    m["switches_after"],
                    f"regrouped under {', '.join(m['switches_after'])} (defragmentation, event {ev.id})",
                )
                job.circuits = self.book.circuits_of(job)
                job.events.append(ev.id)
            self.book.save()
            LOG.info("%s (%d circuit changes, one reconfiguration)", ev.reason, result["circuits_changed"])
        result["circuits_version"] = self.state.circuits_version
        if result["applied"]:
            self.inbox.post(Drain())
        reply.set(result)

    def fragmentation(self) -> dict:
        return policy.fragmentation(self.book.occ())

"""Keeping a job running when it loses GPUs: a server dies, a worker is killed, a NIC's link drops.

Detection: a worker's log stream breaks or it exits with an error (lifecycle._follow), the engine of a server under a
running job stops answering (asked every SERVER_POLL s), or the OCS reports a GPU's port down (the OCS app's
port-status handler). Any of them moves the job to `recovering` with the reason; its recovery thread goes on at once
on a sure sign (a GPU lost), else waits up to SETTLE s for one (`_settle`); other signs of the same fault join it
until it has decided which GPUs are lost: those on a server whose engine does
not answer, those whose link is down, and those whose worker died by a signal (killed: `kill -9`, the OOM killer) or
vanished. A worker that exited with an error of its own (a peer gone from the ring under it) is restarted in place.
A killed worker is not a dead GPU: one killed on a server whose engine answers and whose link is up, for the first
time in the job, is its own last spare (controller/core/spares.py: `restartable`, and `choose` with `own`): with no
free spare of its model it takes its rank again on its own GPU, by the same path (the record's `restarted`); a second
such death sets the GPU aside as any lost one.

The swap: every worker still running is stopped; the checkpoint to go on from is the newest iteration of which a
copy survives on a GPU still in the job (each rank saves one on its own server and one on a peer's on another
server: containers/checkpoint.py); spares are chosen for the lost GPUs by the one rule of controller/core/spares.py
(of the job's model if it asked for one, of the lost GPU's model first, under the job's switch first, then the fastest
for its workload; never a GPU of a server whose engine is down, nor one just lost) and placed with the survivors by
the placement planner, in one circuit change (the spares' circuits moved under the job's switch, the lost GPUs'
released). Then each rank restarts from
the checkpoint: the survivors' workers are replaced in their sandboxes (their NICs stay), the spares get new
containers, and all of them meet at rank 0, a survivor. With no spare free, the job waits at the head of the queue
(no queued job starts before it) and goes on when GPUs free up. The lost GPUs are no longer the job's: a dead
server's come back free when its engine answers again (its stale containers are swept then).

Recovery is state, not memory: the job's persisted record holds the recovery under way (`job.recovery`: its step,
detected -> assessed -> swapped, the signs, the GPUs lost, the survivors, the spares, the attempt), saved at each
step, and every step can be done again. A controller killed while a job is `recovering` carries the recovery on from
the record after its restart (recovery.py calls `resume`); once the job runs again the record is one of its
`recoveries`.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.core import placement as policy
from controller.core import spares as spare_rule
from controller.core.jobs import Job, transition
from controller.core.rack import PortRef
from controller.jobs.external import is_external
from controller.jobs.steps import LOG, RECONFIG_WAIT, _attempt, _reason

SETTLE = 0.3  # at most this long a recovery waits for a sure sign when its first one is not (a worker's own error)
SETTLE_POLL = 0.01  # seconds between two looks at the signs meanwhile
SERVER_POLL = 0.5  # seconds between two pings of the engines under running jobs
WAIT_POLL = 0.5  # seconds between two tries of a job waiting for spares
MAX_RECOVERIES = 5  # a job that keeps losing workers fails after this many recoveries, with the last reason


class Failover:
    def __init__(
        self, book, state, changes, containers, workers, lifecycle, runtime, drain: Callable[[], None],
        hold_at: str | None = None, keep_survivors: bool = True, warm_up: Callable[[Job], None] = lambda job: None,
    ):  # fmt: skip
        self.book, self.state, self.changes, self.containers, self.workers, self.lifecycle, self.rt = (
            book, state, changes, containers, workers, lifecycle, runtime
        )  # fmt: skip
        self.drain = drain  # start queued jobs (queue.Queue.drain)
        self.hold_at = hold_at  # a fault hook for tests: recoveries stop once at this step ("swapped": _hold)
        self.keep_survivors = keep_survivors  # survivors' workers regroup in their processes (False: restarted)
        self.warm_up = warm_up  # start the warm spares a running job asks for (warm.Warm.fill)
        self._collecting: set[str] = set()  # jobs gathering the signs of one fault (until it is assessed)
        self._links_down: set[str] = set()  # OCS ports whose link is down (observed, not the job's)

    # --- detection -------------------------------------------------------------------------
    def lost(self, job: Job, gpu: str, why: str, swap: bool, killed: bool = False) -> bool:
        """A worker of `job` is gone (`swap`: its GPU is lost; `killed`: its worker died by a signal). Starts the
        recovery on the first sign; returns False when the job is not recovered (it was not running, or it used up
        its recoveries)."""
        if job.state == "recovering" and job.id in self._collecting:
            job.recovery["signs"].setdefault(gpu, [why, swap, killed])
            return True
        if job.state != "running":
            return False
        if len(job.recoveries) >= MAX_RECOVERIES:
            LOG.error("%s: %s, after %d recoveries: not recovering it again", job.id, why, len(job.recoveries))
            return False
        self._collecting.add(job.id)
        recovery = {"step": "detected", "detected_at": self.state.clock(), "signs": {gpu: [why, swap, killed]}}
        transition(job, "recovering", reason=why, recovery=recovery)
        LOG.warning("%s recovering: %s", job.id, why)
        _attempt(job, "saving the job", self.book.save)
        self.rt.spawn(self._recover_job, job)
        return True

    def link_changed(self, port: PortRef, up: bool) -> None:
        """The OCS reported a port's link up or down (a GPU's NIC: its job loses that GPU)."""
        key = str(port)
        if up:
            self._links_down.discard(key)
            return
        self._links_down.add(key)
        gpu = self.state.rack.gpu_at(port)
        for job in list(self.book.jobs.values()):
            if gpu is not None and gpu in job.gpus and job.state in ("running", "recovering") and not is_external(job):
                self.lost(job, gpu, f"the link of {gpu}'s NIC ({key}) went down", swap=True)

    def watch_servers(self) -> None:
        """Ask the engines under running jobs every SERVER_POLL s: a server that stops answering loses its GPUs."""
        while True:
            self.rt.sleep(SERVER_POLL)
            try:
                for job in [j for j in self.book.jobs.values() if j.state == "running" and not is_external(j)]:
                    for server in sorted({self.state.rack.server_of[g] for g in job.gpus}):
                        if not self.containers.engines.ping(server):
                            why = self.containers.down_servers().get(server)
                            for g in [g for g in job.gpus if self.state.rack.server_of[g] == server]:
                                self.lost(job, g, f"the Docker Engine of server {server} went down ({why})", True)
            except Exception:  # noqa: BLE001 (the watch goes on)
                LOG.exception("watching the servers of running jobs")

    # --- the recovery ----------------------------------------------------------------------
    def resume(self, job: Job) -> None:
        """After a restart, a job found `recovering`: its recovery goes on from the step its record says (the thread
        that calls this is the job's recovery thread)."""
        step = (job.recovery or {}).get("step", "detected")
        LOG.warning("%s: recovering at the restart (step %s): carrying the recovery on", job.id, step)
        self._recover_job(job, resumed=True)

    def _recover_job(self, job: Job, resumed: bool = False) -> None:
        """The job's recovery thread: which GPUs are lost, the checkpoint, the swap, the restart. Each step is
        recorded in the job's persisted `recovery` (detected -> assessed -> swapped), and each can be done again: a
        controller restarted in the middle carries the recovery on from the record (`resume`)."""
        try:
            if not resumed:
                self._settle(job)
            self._hold(job, "detected")
            rec = job.recovery or {}
            if rec.get("step", "detected") == "detected":
                rec = job.recovery = self._assess(job, rec)
                self._collecting.discard(job.id)  # signs until here joined this recovery
                self.book.save()
                self._hold(job, "assessed")
            self._collecting.discard(job.id)
            keep = self.keep_survivors and not resumed  # after a controller restart: every rank restarted
            self._stop_old_attempt(job, rec, keep)
            while rec["step"] != "swapped":
                if job.state != "recovering":
                    return  # stopped meanwhile
                try:
                    self._swap(job, rec)
                except policy.NoRoomNow as e:
                    self._wait_for_spares(job, rec, str(e))
            self._hold(job, "swapped")
            if job.id in self.book.awaiting:  # it held the queue back: with its spares taken, the others may go
                self.book.awaiting.discard(job.id)
                _attempt(job, "starting queued jobs", self.drain)
            kept = self._restart(job, rec, keep)
        except Exception as e:  # noqa: BLE001 (the edge: a job that cannot be recovered fails with the reason)
            self.book.awaiting.discard(job.id)
            if job.state == "recovering":
                LOG.error("%s: the recovery failed: %s", job.id, e, exc_info=not isinstance(e, RuntimeError))
                self.workers.kill_all(job)
                self.lifecycle.finish(job, "failed", f"{job.reason}; recovering failed: {_reason(e)}")
            elif not job.active:  # stopped while its containers were starting: what started goes too
                _attempt(job, "removing the containers", self.workers.remove, job)
            return
        self.lifecycle.watch(job, kept)

    def _settle(self, job: Job) -> None:
        """Go on at once on a sure sign (a GPU lost: its worker killed by a signal, its server's engine gone, its link
        down); a worker's error of its own may follow another's loss, so wait up to SETTLE s for a sure one. Other
        signs of the same fault join the recovery until it is assessed (`lost`)."""
        waited = 0.0
        while waited < SETTLE and not any(sign[1] for sign in (job.recovery or {}).get("signs", {}).values()):
            self.rt.sleep(SETTLE_POLL)
            waited += SETTLE_POLL

    def _hold(self, job: Job, step: str) -> None:
        """The fault hook (--optirack-fault-hold-recovering, for tests): the recovery thread stops here, its step
        recorded and the job `recovering`, as if the controller died there."""
        if self.hold_at == step:
            LOG.warning("%s: recovery held at step %s by the fault hook", job.id, step)
            while True:
                self.rt.sleep(3600)

    def _assess(self, job: Job, detected: dict) -> dict:
        """Which GPUs are lost, from the signs gathered (`detected`: the recovery's record so far) and the engines and
        links now; the recovery's record from here on (step "assessed")."""
        losing = {g: (sign[0], sign[1]) for g, sign in detected.get("signs", {}).items()}
        killed = [g for g, sign in detected.get("signs", {}).items() if len(sign) > 2 and sign[2]]
        rack = self.state.rack
        servers = sorted({rack.server_of[g] for g in job.gpus})
        down = {s for s in servers if not self.containers.engines.ping(s)}
        lost = {g: why for g, (why, swap) in losing.items() if swap}
        links_down = [g for g in job.gpus if str(rack.gpu_port(g)) in self._links_down]
        for g in job.gpus:
            s = rack.server_of[g]
            if s in down:
                lost.setdefault(g, f"the Docker Engine of server {s} went down")
            elif str(rack.gpu_port(g)) in self._links_down:
                lost.setdefault(g, f"the link of {g}'s NIC went down")
        first = next(iter(losing.values()))[0] if losing else job.reason
        reached = max(
            (r["iteration"] + 1 for g in job.gpus for r in job.reports.get(g, [])
             if r.get("event") == "iteration" and r.get("attempt", 0) == job.attempt),
            default=0,
        )
        return {
            "step": "assessed",
            "attempt": job.attempt + 1,
            "reason": first,
            "detected_at": detected.get("detected_at", self.state.clock()),
            "lost": {g: lost[g] for g in job.gpus if g in lost},
            "restartable": spare_rule.restartable(
                [g for g in job.gpus if g in lost], killed, down, links_down, rack.server_of,
                [g for r in job.recoveries for g in r.get("restarted", {})],
            ),
            "errors": {g: why for g, (why, swap) in losing.items() if not swap},
            "servers_down": sorted(down),
            "reached": reached,
            "old_gpus": list(job.gpus),
        }

    def _survivors(self, rec: dict) -> list[str]:
        """The GPUs whose workers keep their processes: not lost, no error of their own, on a live server."""
        return [g for g in rec["old_gpus"] if g not in rec["lost"] and g not in rec["errors"]
                and self.state.rack.server_of[g] not in rec["servers_down"]]

    def _stop_old_attempt(self, job: Job, rec: dict, keep: bool) -> None:
        """Stop every worker of the attempt that broke (but the survivors, if they are `keep`t) and wait for the
        threads following those on live servers (one following a worker of a server that does not answer may hang:
        it ends on its own, and being of an old attempt, changes nothing)."""
        job.attempt = rec["attempt"]  # again after a restart: the same attempt
        kept = self._survivors(rec) if keep else []
        alive = [g for g in job.gpus if self.state.rack.server_of[g] not in rec["servers_down"] and g not in kept]
        self.workers.kill_on(job, alive)
        threads = dict(zip(job.gpus, self.book.threads.pop(job.id, []), strict=False))
        self.rt.joinall([t for g, t in threads.items() if g in alive])

    def _checkpoint(self, job: Job, survivors: list[str]) -> tuple[int, dict[str, list[str]]]:
        """The newest iteration with a copy on a surviving GPU's server, and its copies: writer -> holders."""
        address = {self.state.rack.addresses[g][0]: g for g in self.state.rack.gpus}
        copies: dict[int, dict[str, list[str]]] = {}
        for g in job.reports:
            for r in job.reports[g]:
                if r.get("event") != "checkpoint":
                    continue
                writer = r.get("writer", g)
                holders = [writer, address.get((r.get("peer") or "").partition(":")[0])]
                alive = [h for h in holders if h in survivors]
                if alive:
                    copies.setdefault(r["iteration"], {}).setdefault(writer, [])
                    copies[r["iteration"]][writer] = sorted(set(copies[r["iteration"]][writer]) | set(alive))
        if not copies:
            return 0, {}
        k = max(copies)
        return k, copies[k]

    def _swap(self, job: Job, rec: dict) -> None:
        """Spares for the lost GPUs and the circuits placing them with the survivors, in one change."""
        rack, lost, own = self.state.rack, rec["lost"], rec.get("restartable", [])
        survivors = [g for g in rec["old_gpus"] if g not in lost]
        job.gpus = [g for g in rec["old_gpus"] if g not in lost or g in own]  # the lost GPUs are no longer the job's
        decided: dict = {}
        if not lost:
            rec.update(spares={}, restarted={}, planning_s=0.0, event=None, step="swapped")
            return
        model = job.request.get("gpu_model")
        workload = job.request["workload"].get("model", "vgg16")

        def plan(current):
            t0 = self.state.clock()
            occ = self.book.occ(current, exclude=job.id, down=self.containers.down_servers())
            down = set(self.containers.down_servers())
            taken = set(self.book.busy_gpus()) | set(lost) | set(survivors)
            free = [g for g in rack.gpus if g not in taken and rack.server_of[g] not in down]
            where = {g: at[0] for g, at in current.gpu_locations(rack).items() if at}
            spares = spare_rule.choose(rack, list(lost), free, workload, job.switches, where, model, own=own)
            # a GPU restarted on itself keeps its rank; spares take the last ones
            gpus = tuple([g for g in rec["old_gpus"] if g not in lost or spares[g] == g]
                         + [s for g, s in spares.items() if s != g])
            p = policy.plan(occ, policy.Request(gpus, "regroup", model, workload))
            decided.update(plan=p, spares=spares, gpus=gpus, planning_s=self.state.clock() - t0)
            return p.target(current)

        t0 = self.state.clock()
        ev = self.changes.change(
            plan,
            "failover",
            lambda: f"{job.id}: " + ", ".join(f"{a} -> {b}" for a, b in decided["spares"].items()) + " (lost)",
            job=job.id,
            wait=RECONFIG_WAIT,
        )
        p = decided["plan"]
        job.gpus, job.switches = list(decided["gpus"]), list(p.switches)
        if ev is not None:
            job.events.append(ev.id)
        job.circuits = self.book.circuits_of(job)
        rec.update(
            spares={g: s for g, s in decided["spares"].items() if s != g},
            restarted={g: lost[g] for g, s in decided["spares"].items() if s == g},
            planning_s=decided["planning_s"],
            ocs_s=self.state.clock() - t0 - decided["planning_s"],
            event=ev.id if ev is not None else None,
            switches=list(p.switches),
            step="swapped",
        )
        self.book.save()

    def _wait_for_spares(self, job: Job, rec: dict, why: str) -> None:
        """No spare now: wait at the head of the queue, checkpoint kept, and try again when GPUs may be free."""
        if job.id not in self.book.awaiting:
            LOG.warning("%s: no spare GPU now (%s); waiting at the head of the queue", job.id, why)
            self.book.awaiting.add(job.id)
            job.note = f"recovering: waiting at the head of the queue for spares: {why}"
            _attempt(job, "saving the job", self.book.save)
            rec["waited_from"] = self.state.clock()
        self.rt.sleep(WAIT_POLL)

    def _restart(self, job: Job, rec: dict, keep: bool) -> list[str]:
        """Every rank from the checkpoint: survivors regroup in their processes (`keep`; else restarted in their
        sandboxes), spares in new containers. The GPUs whose workers kept their processes."""
        rack = self.state.rack
        rec["planned_at"] = self.state.clock()
        old = set(rec["old_gpus"]) - set(job.gpus)
        down = set(self.containers.down_servers())
        gone = [g for g in old if rack.server_of[g] not in down]
        if gone:  # lost on a live server (a killed worker): its containers go, in the background
            self.rt.spawn(self.workers.remove, job, gone)
        survivors = [g for g in job.gpus if g in rec["old_gpus"]]
        k, copies = self._checkpoint(job, survivors)
        restores: dict[str, tuple[int, str, str]] = {}
        if k > 0:
            for g in job.gpus:
                if g in copies and g in copies[g]:
                    restores[g] = (k, "local", g)
                else:  # any surviving copy: the replicas hold the same state
                    writer = sorted(copies)[0]
                    holder = copies[writer][0]
                    restores[g] = (k, rack.addresses[holder][0], writer)
        job.exit_codes = {}
        warm = [s for s in rec["spares"].values() if self.workers.warm.get(s) == job.id]
        told = [g for g in self._survivors(rec) if g in job.gpus] + warm if keep else []
        took = self.workers.regroup(job, told, restores, self.state.clock)
        kept = [g for g in told if took.get(g) is not None]
        self.lifecycle.carry(job, kept)
        cold = [s for s in rec["spares"].values() if s not in kept]
        if cold:
            LOG.warning("%s: no warm spare for %s: starting its container (the slow way)", job.id, ", ".join(cold))
        self.workers.start(job, restores=restores, reuse=True, only=[g for g in job.gpus if g not in kept])
        now = self.state.clock()
        rec.update(
            kept=[g for g in kept if g not in warm],
            warm={s: s in kept for s in rec["spares"].values()},
            told_s={g: round(t, 4) for g, t in took.items() if t is not None},
            resumed_from=k,
            iterations_redone=max(0, rec["reached"] - k),
            containers_s=now - rec["planned_at"],
            running_at=now,
            gpus=list(job.gpus),
        )
        del rec["old_gpus"], rec["step"]
        job.recoveries.append(rec)
        swapped = ", ".join([f"{a} -> {b}" + ("" if rec["warm"][b] else " (no warm spare: a container started)")
                             for a, b in rec["spares"].items()]
                            + [f"{g} restarted on its own GPU" for g in rec.get("restarted", {})]) or "none swapped"
        job.note = f"recovered {len(job.recoveries)} time(s); last: {swapped}, from iteration {k}"
        transition(job, "running", reason=None, recovery=None)
        self.book.save()
        self.rt.spawn(self.warm_up, job)  # a warm spare again, for the next loss
        LOG.info("%s running again (%s) from iteration %d, %d redone; %d rank(s) kept their processes", job.id,
                 swapped, k, rec["iterations_redone"], len(kept))
        return kept

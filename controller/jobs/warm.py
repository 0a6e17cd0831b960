"""Warm spares: free GPUs that hold a started worker of a running job (PyTorch imported, its NIC handed over),
waiting for a rank. A swap that picks one tells it its rank (a regroup command, as the survivors get) instead of
starting a container; a swap that finds none starts one, at the old speed, and says so.

Each running job asks for `warm_spares` of them per GPU model and per switch its GPUs span (its request; default
DEFAULT_WARM_SPARES: a job of one model under one switch keeps one), each chosen by the spare rule
(controller/core/spares.py) as if one of its GPUs of that model under that switch were lost, among GPUs no job holds
and no other job keeps warm, on servers that are up, and only of that model: a job whose model has no free GPU keeps
none there. A spare of another model is still taken on a loss (the spare rule's fallback), but started cold (a new
container and its NIC hand-over, as before warm spares): kept warm, it would sit on a GPU that jobs asking for that
model want, each of which would first wait for its eviction. They are the job's containers (its labels, its
checkpoint volume), not its GPUs: any job placed on such a GPU evicts the warm worker first (runs.py), a job that ends
removes its own, and a restarted controller sweeps them (they are not among its jobs' GPUs).

A step of the loop on every Reconcile of a running job: what it lacks is decided (and registered in the book at
once, so two jobs never pick one GPU) and each started by an action of its own; a warm worker is followed, so that
one that dies is replaced.
"""

from __future__ import annotations

from collections import Counter

from controller.core import spares as spare_rule
from controller.core.jobs import DEFAULT_WARM_SPARES, Job
from controller.jobs.actions import Actions
from controller.jobs.book import JobBook
from controller.jobs.inbox import Done, Inbox
from controller.jobs.ports import ContainersPort
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG
from controller.jobs.workers import Workers


class Warm:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, containers: ContainersPort, enabled: bool = True):
        self.book, self.inbox, self.rt, self.containers = book, inbox, rt, containers
        self.workers = Workers(book, containers, inbox, rt)
        self.actions = Actions(book, inbox, rt)
        self.enabled = enabled  # a warm spare is handed its rank as survivors are: off where they are restarted

    def reconcile(self, job: Job) -> None:
        each = job.request.get("warm_spares", DEFAULT_WARM_SPARES)
        if not self.enabled or job.kind != "containers" or job.state != "running" or each <= 0 \
                or job.id in self.book.ending:  # an external job's ranks are its scheduler's: no worker of ours
            return
        book, rack = self.book, self.book.rack
        down = set(book.down) | set(self.containers.down_servers())
        taken = set(book.busy_gpus()) | set(book.warm) | set(book.unlinked())
        free = [g for g in rack.gpus if g not in taken and rack.server_of[g] not in down]
        where = {g: at[0] for g, at in book.state.circuits.gpu_locations(rack).items() if at}
        workload = job.request["workload"].get("model", "vgg16")
        groups: dict[tuple, str] = {}  # (GPU model, switch) the job spans -> one of its GPUs there, lost as if
        for g in job.gpus:
            groups.setdefault((rack.gpus[g].model, where.get(g)), g)
        mine = [g for g, j in book.warm.items() if j == job.id]
        have = Counter(book.serves.get(g) for g in mine)
        for key, as_if in groups.items():
            for _ in range(each - have[key]):
                try:
                    spare = spare_rule.choose(rack, [as_if], [g for g in free if rack.gpus[g].model == key[0]],
                                              workload, job.switches, where, job.request.get("gpu_model"))[as_if]
                except spare_rule.NoRoomNow:
                    if job.id not in book.unwarmed:
                        LOG.info("%s: no free %s GPU to keep warm for its GPUs under %s; a loss there starts a "
                                 "spare cold", job.id, *key)
                        book.unwarmed.add(job.id)
                    break
                free.remove(spare)
                book.warm[spare], book.serves[spare] = job.id, key
                self.actions.start(job.id, "warm.started", self._start, job, spare, tracked=False)

    def drain(self, _=None) -> None:
        """GPUs may be free: running jobs short of warm spares get them."""
        for job in [j for j in self.book.jobs.values() if j.state == "running"]:
            self.reconcile(job)

    def _start(self, job: Job, gpu: str) -> tuple[str, BaseException | None]:
        try:
            self.workers.start_warm(job, gpu)
        except Exception as e:  # noqa: BLE001 (a job without warm spares recovers at the old speed)
            return gpu, e
        return gpu, None

    def started(self, done: Done) -> None:
        gpu, error = done.result
        job = self.book.jobs.get(done.job)
        mine = self.book.warm.get(gpu) == done.job
        if error is not None:
            LOG.warning("%s: no warm spare started on %s: %s", done.job, gpu, error)
            if mine:
                del self.book.warm[gpu]
                self.book.serves.pop(gpu, None)
            return
        if job is None or not mine:  # evicted, or its job ended, while it started: what started goes
            if job is None or gpu not in job.gpus:
                self.actions.start(done.job, "warm.removed", self.workers.remove_warm, gpu, done.job, tracked=False)
            return
        fid = self.book.followers[(job.id, gpu)] = next(self.book.fids)
        self.workers.follow(job, gpu, fid)
        LOG.info("%s: a warm spare waits on %s (for its %s GPUs under %s)", job.id, gpu, *self.book.serves[gpu])

    def removed(self, done: Done) -> None:
        if done.error is not None:
            LOG.error("removing a warm spare of %s: %s", done.job, done.error)

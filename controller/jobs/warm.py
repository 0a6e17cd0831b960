"""Warm spares: free GPUs that hold a started worker of a running job (PyTorch imported, its NIC handed over),
waiting for a rank. A swap that picks one tells it its rank (a regroup command, as the survivors get) instead of
starting a container; a swap that finds none starts one, at the old speed, and says so.

Each running job asks for `warm_spares` of them per GPU model and per switch its GPUs span (its request; default
DEFAULT_WARM_SPARES: a job of one model under one switch keeps one), each chosen by the spare rule
(controller/core/spares.py) as if one of its GPUs of that model under that switch were lost, among GPUs no job holds
and no other job keeps warm, on servers whose engine answers, and only of that model: a job whose model has no free
GPU keeps none there. A spare of another model is still taken on a loss (the spare rule's fallback), but started cold
(a new container and its NIC hand-over, as before warm spares): kept warm, it would sit on a GPU that jobs asking for
that model want, each of which would first wait for its eviction. They are the job's containers (its labels, its
checkpoint volume), not its GPUs: any job placed on such a GPU evicts the warm worker first (Workers.start), a job
that ends removes its own, and a restarted controller sweeps them (they are not among its jobs' GPUs).
"""

from __future__ import annotations

from collections import Counter

from controller.core import spares as spare_rule
from controller.core.jobs import DEFAULT_WARM_SPARES, Job
from controller.jobs.external import is_external
from controller.jobs.steps import LOG


class Warm:
    def __init__(self, book, state, containers, workers, runtime, enabled: bool = True):
        self.book, self.state, self.containers, self.workers, self.rt = book, state, containers, workers, runtime
        self.enabled = enabled  # a warm spare is handed its rank as survivors are: off where they are restarted
        self.lock = runtime.lock()  # one job's warm-up at a time: two do not pick the same GPU
        self.serves: dict[str, tuple] = {}  # a warm spare -> the (GPU model, switch) of the job's GPUs it stands by

    def fill(self, job: Job) -> None:
        """Start the warm workers `job` asks for that it does not have (in its own thread: never raises)."""
        try:
            with self.lock:
                self._fill(job)
        except Exception as e:  # noqa: BLE001 (a job without warm spares recovers at the old speed)
            LOG.warning("%s: no warm spare started: %s", job.id, e)

    def _fill(self, job: Job) -> None:
        each = job.request.get("warm_spares", DEFAULT_WARM_SPARES)
        if not self.enabled or job.state != "running" or is_external(job) or each <= 0:
            return
        rack, down = self.state.rack, set(self.containers.down_servers())
        taken = set(self.book.busy_gpus()) | set(self.workers.warm)
        free = [g for g in rack.gpus if g not in taken and rack.server_of[g] not in down]
        where = {g: at[0] for g, at in self.state.circuits.gpu_locations(rack).items() if at}
        workload = job.request["workload"].get("model", "vgg16")
        groups: dict[tuple, str] = {}  # (GPU model, switch) the job spans -> one of its GPUs there, lost as if
        for g in job.gpus:
            groups.setdefault((rack.gpus[g].model, where.get(g)), g)
        mine = {g for g, j in self.workers.warm.items() if j == job.id}
        self.serves = {g: k for g, k in self.serves.items() if self.workers.warm.get(g) is not None}
        have = Counter(self.serves.get(g) for g in mine)
        for key, as_if in groups.items():
            for _ in range(each - have[key]):
                try:
                    spare = spare_rule.choose(rack, [as_if], [g for g in free if rack.gpus[g].model == key[0]],
                                              workload, job.switches, where, job.request.get("gpu_model"))[as_if]
                except spare_rule.NoRoomNow:
                    LOG.info("%s: no free %s GPU to keep warm for its GPUs under %s; a loss there starts a spare "
                             "cold", job.id, *key)
                    break
                free.remove(spare)
                if self.workers.start_warm(job, spare, lambda g=spare: g in self.book.busy_gpus() or not job.active):
                    self.serves[spare] = key
                    LOG.info("%s: a warm spare waits on %s (for its %s GPUs under %s)", job.id, spare, *key)

"""A job's workers on the containers port: one sandbox, NIC and worker per GPU on its server's engine, started all
at once (from a checkpoint after a loss), killed, their last lines kept, removed with the job's checkpoints.

One owner for a GPU's leftovers at a time: whatever removes or starts a container on a GPU other than the job's own
ranks (a warm spare started or evicted, another job's container cleared before a start, the sweep of a server after a
restart or when its engine comes back: recovery.py) holds that GPU's lock (`owning`) across it, so two of them never
remove one container at once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from controller.core.jobs import DEFAULT_CHECKPOINT_EVERY, Job
from controller.drivers.containers import CHECKPOINTS, ContainerError, GpuContainer
from controller.drivers.engines import EngineDown
from controller.jobs.steps import LOG, LOG_LINES, _attempt


def master_port(attempt: int) -> int:
    """Where rank 0 meets the others: a port of each attempt's own (a kept worker may still hold the last one's)."""
    return 29500 if attempt == 0 else 29600 + attempt


class Workers:
    def __init__(self, rack, containers, runtime):
        self.rack, self.containers, self.rt = rack, containers, runtime
        self.warm: dict[str, str] = {}  # GPU -> the job whose warm spare waits on it (warm.py)
        self._owners: dict = {}  # GPU -> the lock held by whoever starts or removes a leftover there (owning)
        self._gone: set[tuple[str, str]] = set()  # (GPU, job): warm spares removed as they started (evicted)

    def _spec(self, job: Job, gpu: str, command: list[str]) -> GpuContainer:
        g, prefix = self.rack.gpus[gpu], self.rack.spec.network.subnet.prefixlen
        return GpuContainer(job.id, gpu, self.rack.server_of[gpu], g.index, g.model, self.rack.interface(gpu),
                            f"{self.rack.addresses[gpu][0]}/{prefix}", command)

    @contextlib.contextmanager
    def owning(self, gpus: Iterable[str]) -> Iterator[None]:
        """Hold the leftovers' locks of `gpus` (in name order, so two holders of overlapping sets never deadlock)."""
        with contextlib.ExitStack() as stack:
            for gpu in sorted(set(gpus)):
                stack.enter_context(self._owners.setdefault(gpu, self.rt.lock()))
            yield

    def start_warm(self, job: Job, gpu: str, taken) -> bool:
        """A warm spare of `job` on free `gpu`: its sandbox, NIC and a worker that waits for its rank. Registered
        first, then `taken()` asked again (a job placed there meanwhile: none started, False); one evicted while it
        started is removed once started."""
        w = job.request["workload"]
        cmd = ["--warm", "--rank", "0", "--world-size", "1", "--master", "0.0.0.0", "--mode", w["mode"],
               "--wait-for-nic", "60"]
        self.warm[gpu] = job.id
        if taken():
            self.warm.pop(gpu, None)
            return False
        self._gone.discard((gpu, job.id))
        with self.owning([gpu]):  # an eviction waits for the start, and its removal
            try:
                # what a worker of this job left on this GPU (one that died there: its lines are read, its exit
                # code known) goes first, or its name stands in the way
                self.containers.remove(job.id, gpu, self.rack.server_of[gpu])
                self.containers.start(self._spec(job, gpu, cmd), job.image or self.containers.worker_image(
                    self.rack.server_of[gpu]))
            except Exception:
                if self.warm.get(gpu) == job.id:
                    del self.warm[gpu]
                raise
            if self.warm.get(gpu) != job.id:  # evicted, or its job ended, while it started
                self._remove(gpu, job.id)
                self._gone.add((gpu, job.id))
        return True

    def _remove(self, gpu: str, owner: str) -> None:
        try:
            self.containers.remove(owner, gpu, self.rack.server_of[gpu])
        except Exception as e:  # noqa: BLE001 (its engine is down: swept when it is back)
            LOG.error("removing the warm spare of %s on %s: %s", owner, gpu, e)

    def _remove_warm(self, gpu: str, owner: str) -> None:
        with self.owning([gpu]):
            if (gpu, owner) in self._gone:  # removed as it started
                self._gone.discard((gpu, owner))
                return
            self._remove(gpu, owner)

    def evict(self, gpus, job: Job | None = None) -> None:
        """Remove the warm spares waiting on `gpus` (all of `job`'s, if given), all at once."""
        gone = [(g, j) for g, j in list(self.warm.items()) if g in gpus or (job is not None and j == job.id)]
        for g, _ in gone:
            self.warm.pop(g, None)

        def one(gpu: str, owner: str) -> None:
            self._remove_warm(gpu, owner)

        self.rt.joinall([self.rt.spawn(one, g, j) for g, j in gone])

    def checkpoint_peer(self, job: Job, rank: int) -> str | None:
        """The NIC address of the next rank around the ring on another server (None: all on one server)."""
        server_of, n = self.rack.server_of, len(job.gpus)
        for step in range(1, n):
            other = job.gpus[(rank + step) % n]
            if server_of[other] != server_of[job.gpus[rank]]:
                return self.rack.addresses[other][0]
        return None

    def command(self, job: Job, rank: int, restore: tuple[int, str, str] | None = None) -> list[str]:
        w, emulation = job.request["workload"], self.rack.spec.emulation
        cmd = [
            "--rank", str(rank),
            "--world-size", str(len(job.gpus)),
            "--master", self.rack.addresses[job.gpus[0]][0],
            "--master-port", str(master_port(job.attempt)),
            "--attempt", str(job.attempt),
            "--mode", w["mode"],
            "--iterations", str(w["iterations"]),
            "--rate-scale", str(emulation.rate_scale),
            "--time-dilation", str(emulation.time_dilation),
            "--wait-for-nic", "60",
            "--batch", str(w["batch"]),
        ]  # fmt: skip
        if w["mode"] == "profile":
            cmd += ["--workload", w["model"]]
        if w.get("compute_seconds") is not None:
            cmd += ["--compute-seconds", str(w["compute_seconds"])]
        every = job.request.get("checkpoint_every", DEFAULT_CHECKPOINT_EVERY)
        cmd += ["--checkpoint-dir", CHECKPOINTS, "--checkpoint-every", str(every)]
        peer = self.checkpoint_peer(job, rank)
        if peer is not None:
            cmd += ["--checkpoint-peer", peer]
        if restore is not None:
            cmd += ["--resume-from", str(restore[0]), "--restore-from", restore[1], "--restore-writer", restore[2]]
        return cmd

    def _clear(self, job: Job, gpus: list[str], servers) -> None:
        """Remove what another job left on `gpus` (a warm spare of a controller that was restarted before its sweep):
        a GPU placed for `job` is `job`'s. Listed and removed holding the GPUs (`owning`): a sweep of the same server
        meanwhile waits, then finds them gone."""
        with self.owning(gpus):
            stale = []
            for server in sorted(servers):
                try:
                    stale += [(w["job"], w["gpu"], server) for w in self.containers.workers(server)
                              if w["gpu"] in gpus and w["job"] != job.id]
                except Exception as e:  # noqa: BLE001 (the start names an engine that is down)
                    LOG.debug("listing the containers on %s: %s", server, e)
            for other, gpu, server in sorted(set(stale)):
                LOG.warning("%s: removing %s's container left on %s", job.id, other, gpu)
                self.containers.remove(other, gpu, server)

    def regroup(self, job: Job, gpus: list[str], restores: dict, clock) -> dict[str, float | None]:
        """Tell the running workers of `gpus` to leave their ring and join the job's new one (its attempt, their
        ranks in it, the checkpoint to go on from), all at once; GPU -> seconds its telling took (None: its worker
        could not be told)."""
        took: dict[str, float | None] = {}

        def one(gpu: str) -> None:
            rank, t0 = job.gpus.index(gpu), clock()
            try:
                self.containers.regroup(job.id, gpu, self.rack.server_of[gpu], job.attempt,
                                        self.command(job, rank, restores.get(gpu)))
                took[gpu] = clock() - t0
            except Exception as e:  # noqa: BLE001 (it is started anew instead)
                LOG.warning("%s: the worker on %s cannot regroup (%s); starting it anew", job.id, gpu, e)
                took[gpu] = None

        self.rt.joinall([self.rt.spawn(one, g) for g in gpus])
        return took

    def start(self, job: Job, restores: dict | None = None, reuse: bool = False, only=None) -> None:
        """One sandbox, NIC and worker per GPU (of `only`, if given), on each GPU's own server's engine, all at once;
        the engines are asked first, so a server that is down fails the job at once, naming it. After a loss
        (failover.py): each rank's checkpoint to restore, and the survivors' sandboxes kept (`reuse`)."""
        restores = restores or {}
        rack = self.rack
        servers = {rack.server_of[g] for g in job.gpus if only is None or g in only}
        # a warm spare of another job waiting on one of these GPUs goes (one of this job's is replaced, as a worker)
        self.evict([g for g in job.gpus if self.warm.get(g) not in (None, job.id if reuse else None)
                    and (only is None or g in only)])
        for g in [g for g in job.gpus if self.warm.get(g) == job.id]:
            del self.warm[g]  # its warm spare, now one of its ranks (told, or its worker replaced in its sandbox)
        self._clear(job, [g for g in job.gpus if only is None or g in only], servers)
        if not servers:
            return  # every rank was told (failover.py): nothing to start
        try:
            self.containers.check_engines(servers)
            image = job.image or self.containers.worker_image(rack.server_of[job.gpus[0]])
        except EngineDown as e:
            raise ContainerError(str(e)) from None
        except Exception as e:  # noqa: BLE001 (registry or engine refused: fail the job with the reason)
            raise ContainerError(
                f"cannot start the containers: the worker image {self.containers.image} cannot be had "
                f"({str(e).strip().splitlines()[-1] if str(e).strip() else e.__class__.__name__})"
            ) from None
        job.image = image

        def one(rank: int, gpu: str) -> None:
            self.containers.start(self._spec(job, gpu, self.command(job, rank, restores.get(gpu))), image, reuse=reuse)

        threads = [self.rt.spawn(one, rank, gpu, raise_error=True) for rank, gpu in enumerate(job.gpus)
                   if only is None or gpu in only]
        errors = []
        for t in threads:
            try:
                t.wait()
            except Exception as e:  # noqa: BLE001 (collected: the first one is the job's reason)
                errors.append(e)
        if errors:
            self.remove(job)
            raise errors[0]  # the job's edge tells an expected failure from a bug by its type

    def remove(self, job: Job, gpus=None) -> None:
        """Give each NIC back and remove the containers, on every engine at once; an engine that is
        down is skipped (its containers are swept when it comes back)."""

        def one(gpu: str) -> None:
            server = self.rack.server_of[gpu]
            try:
                self.containers.remove(job.id, gpu, server)
            except Exception as e:  # noqa: BLE001 (keep cleaning the others)
                LOG.error("%s: removing the containers of %s on %s: %s", job.id, gpu, server, e)

        self.rt.joinall([self.rt.spawn(one, gpu) for gpu in (gpus if gpus is not None else job.gpus)])
        if gpus is None:
            self.evict((), job)  # its warm spares too

    def kill(self, job: Job, gpu: str) -> None:
        try:
            self.containers.kill(job.id, gpu, self.rack.server_of[gpu])
        except Exception as e:  # noqa: BLE001 (already gone, or its engine is down)
            LOG.debug("%s: kill %s: %s", job.id, gpu, e)

    def kill_all(self, job: Job) -> None:
        for gpu in job.gpus:
            _attempt(job, f"stopping the worker on {gpu}", self.kill, job, gpu)

    def kill_on(self, job: Job, gpus: list[str]) -> None:
        """Kill the workers of `gpus`, all at once."""
        self.rt.joinall([self.rt.spawn(self.kill, job, g) for g in gpus])

    def keep_logs(self, job: Job) -> None:
        """The last lines of each worker's output (stdout and stderr), read before its container goes."""
        for gpu in job.gpus:
            try:
                job.logs[gpu] = self.containers.tail(job.id, gpu, self.rack.server_of[gpu], LOG_LINES)
            except Exception as e:  # noqa: BLE001 (no container, or no engine: nothing to keep)
                LOG.debug("%s: no logs of %s: %s", job.id, gpu, e)

    def logs(self, job: Job, tail: int = LOG_LINES) -> tuple[dict[str, list[str]], str]:
        """A running job's live log lines (from its containers), else the lines kept when it ended."""
        if job.state == "running":
            live = {}
            for gpu in job.gpus:
                try:
                    live[gpu] = self.containers.tail(job.id, gpu, self.rack.server_of[gpu], tail)
                except Exception as e:  # noqa: BLE001 (report what can be read)
                    live[gpu] = [f"(cannot read the container's log: {e})"]
            return live, "containers"
        return {g: lines[-tail:] for g, lines in job.logs.items()}, "kept when the job ended"

    def remove_volumes(self, job: Job) -> None:
        """The job's checkpoints on every server it ran on (a server that is down is swept when it is back)."""
        servers = {self.rack.server_of[g] for g in job.gpus}
        for r in job.recoveries:
            servers |= {self.rack.server_of[g] for g in r.get("lost", {})}
        for server in sorted(servers):
            if server in self.containers.down_servers():
                continue
            try:
                self.containers.remove_volume(job.id, server)
            except Exception as e:  # noqa: BLE001 (the sweep removes it later)
                LOG.error("%s: removing the checkpoints on %s: %s", job.id, server, e)

    def present(self, job: Job) -> list[str]:
        """The GPUs of `job` whose worker is still on its server's engine: running, or exited while
        the controller was down (its exit code and output still say how it ended, and following it
        records that)."""
        found = []
        for server in sorted({self.rack.server_of[g] for g in job.gpus}):
            try:
                found += [w["gpu"] for w in self.containers.workers(server, job.id)
                          if w["role"] == "worker" and w["gpu"] in job.gpus]  # not its warm spares
            except Exception as e:  # noqa: BLE001 (engine unreachable: its workers count as gone)
                LOG.error("cannot list containers on %s: %s", server, e)
        return found

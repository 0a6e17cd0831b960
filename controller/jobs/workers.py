"""A job's workers, through the containers port: one sandbox, NIC and worker per GPU on its server's engine, started all
at once (from a checkpoint after a loss), told to regroup, killed, followed, their last lines kept, removed with the
job's checkpoints. The I/O the service's actions do (actions.py): none of it decides anything or changes the book, but
for following a worker, which only posts what it reads to the inbox.

One owner for a GPU's leftovers at a time: whatever removes or starts a container on a GPU other than the job's own
ranks (a warm spare started or evicted, another job's container cleared before a start, the sweep of a server after a
restart or when its engine comes back) holds that GPU's lock (`owning`; the locks live in the book, so every part's
Workers shares them) across it, so two of them never remove one container at once."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator

from controller.core.jobs import DEFAULT_CHECKPOINT_EVERY, Job
from controller.jobs import aggregation
from controller.jobs.book import JobBook
from controller.jobs.inbox import Inbox, WorkerEnded, WorkerLine
from controller.jobs.ports import CHECKPOINTS, ContainerError, ContainersPort, EngineDown, GpuContainer
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG, LOG_LINES

Restores = dict[str, tuple[int, str, str]]  # GPU -> (the checkpoint's iteration, its holder or "local", its writer)


def master_port(attempt: int) -> int:
    """Where rank 0 meets the others: a port of each attempt's own (a kept worker may still hold the last one's)."""
    return 29500 if attempt == 0 else 29600 + attempt


class Workers:
    def __init__(self, book: JobBook, containers: ContainersPort, inbox: Inbox, rt: Runtime):
        self.book, self.containers, self.inbox, self.rt = book, containers, inbox, rt
        self.rack = book.rack

    @contextlib.contextmanager
    def owning(self, gpus: Iterable[str]) -> Iterator[None]:
        """Hold the leftovers' locks of `gpus` (in name order, so two holders of overlapping sets never deadlock)."""
        with contextlib.ExitStack() as stack:
            for gpu in sorted(set(gpus)):
                stack.enter_context(self.book.owners.setdefault(gpu, self.rt.lock()))
            yield

    def server(self, gpu: str) -> str:
        return self.rack.server_of[gpu]

    def spec(self, job: Job, gpu: str, command: list[str]) -> GpuContainer:
        g, prefix = self.rack.gpus[gpu], self.rack.spec.network.subnet.prefixlen
        return GpuContainer(job.id, gpu, self.server(gpu), g.index, g.model, self.rack.interface(gpu),
                            f"{self.rack.addresses[gpu][0]}/{prefix}", command)

    # --- commands ---------------------------------------------------------------------------------
    def checkpoint_peer(self, job: Job, rank: int) -> str | None:
        """The NIC address of the next rank around the ring on another server (None: all on one server)."""
        n = len(job.gpus)
        for step in range(1, n):
            other = job.gpus[(rank + step) % n]
            if self.server(other) != self.server(job.gpus[rank]):
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
        return cmd + aggregation.worker_args(job)

    # --- starting -----------------------------------------------------------------------------------
    def start(self, job: Job, gpus: list[str], restores: Restores | None = None, reuse: bool = False,
              evict: Iterable[tuple[str, str]] = ()) -> str:
        """One sandbox, NIC and worker per GPU of `gpus` (ranks by the job's order), on each GPU's own server's engine,
        all at once; what another job left on them goes first (`evict`: warm spares of other jobs there). The engines
        are asked first, so a server that is down fails the start at once, naming it. After a loss: each rank's
        checkpoint to restore, and the sandboxes kept (`reuse`). All or nothing: a failure removes what started.
        Returns the worker image (repo@digest where a registry serves it)."""
        restores = restores or {}
        self.rt.joinall([self.rt.spawn(self.remove_warm, g, owner) for g, owner in evict])
        servers = {self.server(g) for g in gpus}
        self._clear(job, gpus, servers)
        try:
            self.containers.check_engines(servers)
            image = job.image or self.containers.worker_image(self.server(job.gpus[0]))
        except EngineDown:
            raise
        except Exception as e:  # noqa: BLE001 (registry or engine refused: fail the job with the reason)
            raise ContainerError(
                f"cannot start the containers: the worker image {self.containers.image} cannot be had "
                f"({str(e).strip().splitlines()[-1] if str(e).strip() else e.__class__.__name__})"
            ) from None

        def one(gpu: str) -> None:
            rank = job.gpus.index(gpu)
            self.containers.start(self.spec(job, gpu, self.command(job, rank, restores.get(gpu))), image, reuse=reuse)

        threads = [self.rt.spawn(one, g, raise_error=True) for g in gpus]
        errors = []
        for t in threads:
            try:
                t.wait()
            except Exception as e:  # noqa: BLE001 (collected: the first one is the reason)
                errors.append(e)
        if errors:
            self.remove(job, gpus)
            raise errors[0]
        return image

    def _clear(self, job: Job, gpus: list[str], servers: set[str]) -> None:
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

    def start_warm(self, job: Job, gpu: str) -> None:
        """A warm spare of `job` on free `gpu`: its sandbox, NIC and a worker that waits for its rank. What a worker of
        this job left on this GPU (one that died there) goes first, or its name stands in the way."""
        w = job.request["workload"]
        cmd = ["--warm", "--rank", "0", "--world-size", "1", "--master", "0.0.0.0", "--mode", w["mode"],
               "--wait-for-nic", "60"]
        with self.owning([gpu]):
            self.containers.remove(job.id, gpu, self.server(gpu))
            self.containers.start(self.spec(job, gpu, cmd), job.image or self.containers.worker_image(self.server(gpu)))

    def remove_warm(self, gpu: str, owner: str) -> None:
        with self.owning([gpu]):
            try:
                self.containers.remove(owner, gpu, self.server(gpu))
            except Exception as e:  # noqa: BLE001 (its engine is down: swept when it is back)
                LOG.error("removing the warm spare of %s on %s: %s", owner, gpu, e)

    # --- a running job's workers ----------------------------------------------------------------------
    def regroup(self, job: Job, gpus: list[str], restores: Restores, clock) -> dict[str, float | None]:
        """Tell the running workers of `gpus` to leave their ring and join the job's new one (its attempt, their
        ranks in it, the checkpoint to go on from), all at once; GPU -> seconds its telling took (None: its worker
        could not be told)."""
        took: dict[str, float | None] = {}

        def one(gpu: str) -> None:
            rank, t0 = job.gpus.index(gpu), clock()
            try:
                self.containers.regroup(job.id, gpu, self.server(gpu), job.attempt,
                                        self.command(job, rank, restores.get(gpu)))
                took[gpu] = clock() - t0
            except Exception as e:  # noqa: BLE001 (it is started anew instead)
                LOG.warning("%s: the worker on %s cannot regroup (%s); starting it anew", job.id, gpu, e)
                took[gpu] = None

        self.rt.joinall([self.rt.spawn(one, g) for g in gpus])
        return took

    def kill(self, job: Job, gpus: Iterable[str]) -> None:
        """Kill the workers of `gpus`, all at once (one already gone, or on an engine that is down, is passed over)."""

        def one(gpu: str) -> None:
            try:
                self.containers.kill(job.id, gpu, self.server(gpu))
            except Exception as e:  # noqa: BLE001 (already gone, or its engine is down)
                LOG.debug("%s: kill %s: %s", job.id, gpu, e)

        self.rt.joinall([self.rt.spawn(one, g) for g in gpus])

    def remove(self, job: Job, gpus: Iterable[str]) -> None:
        """Give each NIC back and remove the containers, on every engine at once; an engine that is down is skipped
        (its containers are swept when it comes back)."""

        def one(gpu: str) -> None:
            try:
                self.containers.remove(job.id, gpu, self.server(gpu))
            except Exception as e:  # noqa: BLE001 (keep cleaning the others)
                LOG.error("%s: removing the containers of %s on %s: %s", job.id, gpu, self.server(gpu), e)

        self.rt.joinall([self.rt.spawn(one, g) for g in gpus])

    def tails(self, job: Job, gpus: Iterable[str], lines: int = LOG_LINES) -> dict[str, list[str]]:
        """The last lines of each worker's output (stdout and stderr), read before its container goes."""
        out = {}
        for gpu in gpus:
            try:
                out[gpu] = self.containers.tail(job.id, gpu, self.server(gpu), lines)
            except Exception as e:  # noqa: BLE001 (no container, or no engine: nothing to keep)
                LOG.debug("%s: no logs of %s: %s", job.id, gpu, e)
        return out

    def logs(self, job: Job, tail: int = LOG_LINES) -> tuple[dict[str, list[str]], str]:
        """A running job's live log lines (from its containers), else the lines kept when it ended."""
        if job.state == "running":
            live = {}
            for gpu in job.gpus:
                try:
                    live[gpu] = self.containers.tail(job.id, gpu, self.server(gpu), tail)
                except Exception as e:  # noqa: BLE001 (report what can be read)
                    live[gpu] = [f"(cannot read the container's log: {e})"]
            return live, "containers"
        return {g: lines[-tail:] for g, lines in job.logs.items()}, "kept when the job ended"

    def remove_volumes(self, job: Job, servers: Iterable[str]) -> None:
        """The job's checkpoints on `servers` (one that is down is swept when it is back)."""
        for server in sorted(set(servers)):
            if server in self.containers.down_servers():
                continue
            try:
                self.containers.remove_volume(job.id, server)
            except Exception as e:  # noqa: BLE001 (the sweep removes it later)
                LOG.error("%s: removing the checkpoints on %s: %s", job.id, server, e)

    def present(self, job: Job) -> list[str]:
        """The GPUs of `job` whose worker is still on its server's engine: running, or exited while the controller was
        down (its exit code and output still say how it ended, and following it records that)."""
        found = []
        for server in sorted({self.server(g) for g in job.gpus}):
            try:
                found += [w["gpu"] for w in self.containers.workers(server, job.id)
                          if w["role"] == "worker" and w["gpu"] in job.gpus]
            except Exception as e:  # noqa: BLE001 (engine unreachable: its workers count as gone)
                LOG.error("cannot list containers on %s: %s", server, e)
        return found

    def running(self, job: Job, gpus: Iterable[str]) -> list[str]:
        """Of `gpus`, those whose worker of `job` runs now on its server's engine (a server that does not answer:
        none of its)."""
        gpus = set(gpus)
        found = []
        for server in sorted({self.server(g) for g in gpus}):
            try:
                found += [w["gpu"] for w in self.containers.workers(server, job.id)
                          if w["role"] == "worker" and w["gpu"] in gpus and w["status"] == "running"]
            except Exception as e:  # noqa: BLE001 (its engine does not answer: none of its workers counts)
                LOG.debug("cannot list containers on %s: %s", server, e)
        return sorted(found)

    def sweep(self, server: str) -> list[str]:
        """Remove what is left on `server` of jobs that are over, and of GPUs a job that goes on no longer holds,
        holding the server's GPUs from deciding what is stale to the end (so a job starting there meanwhile, or a warm
        spare started or evicted, is never removed twice nor taken for stale); the GPUs whose containers went."""
        with self.owning([g for g in self.rack.gpus if self.server(g) == server]):
            jobs = [j for j in self.book.jobs.values() if j.active or j.id in self.book.stopping]
            keep = {j.id for j in jobs}
            pairs = {(j.id, g) for j in jobs for g in j.gpus}
            pairs |= {(j, g) for g, j in self.book.warm.items() if j in keep}
            return self.containers.sweep(server, keep, pairs)

    # --- following ----------------------------------------------------------------------------------
    def follow(self, job: Job, gpu: str, fid: int) -> None:
        """Follow one worker in a thread of its own: each JSON line it prints, and its end, posted to the inbox (tagged
        with follower `fid`: the loop takes only its current follower's word for a rank)."""
        self.rt.spawn(self._follow, job.id, gpu, fid)

    def _follow(self, job: str, gpu: str, fid: int) -> None:
        server = self.server(gpu)
        code: int | None = None
        try:
            buf = b""
            for chunk in self.containers.logs(job, gpu, server):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.startswith(b"{"):
                        try:
                            data = json.loads(line)
                        except ValueError:
                            continue
                        self.inbox.post(WorkerLine(job, gpu, fid, data, self.book.clock()))
            code = self.containers.wait(job, gpu, server)
            why = f"the worker on {gpu} exited with {code}"
        except Exception as e:  # noqa: BLE001 (the container vanished, or its engine went down: asked which)
            why = str(e) or e.__class__.__name__
            if not self.containers.engines.ping(server):
                down = self.containers.down_servers().get(server, "it does not answer")
                why = f"the Docker Engine of server {server} went down ({down})"
        self.inbox.post(WorkerEnded(job, gpu, fid, code, why))

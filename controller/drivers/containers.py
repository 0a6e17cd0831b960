"""The container driver: one worker per GPU on its server's own Docker Engine, holding exactly that
GPU and that GPU's NIC, with no agent of ours on the server.

For each GPU, the way Kubernetes runs a pod: a sandbox container (from the helper image, asleep,
no Docker network) owns a network namespace; a short-lived helper container on the same engine
(host network and PID namespaces, NET_ADMIN and SYS_ADMIN) runs the standard CNI host-device
plugin to move the GPU's NIC into that namespace and address it (`optirack-nic add`); the worker
joins the sandbox's namespace. The NIC thus outlives the worker, and before the sandbox goes the
helper gives it back (`optirack-nic del`). On a GPU host the worker gets a device request for
exactly its GPU; elsewhere the GPU's id and model are in its environment and it emulates the GPU.
The controller itself makes no namespace or netlink call: everything happens through the engine.
"""
from __future__ import annotations

import logging
import time
import uuid

from controller.core.rack import Rack
from controller.drivers.control import CONTROL_PARENT, regroup_archive
from controller.drivers.engines import Engines
from controller.drivers.nic import HELPER_CAPS, home_settings, sandbox_sysctls
from controller.jobs.ports import CHECKPOINTS, ContainerError, EngineDown, GpuContainer

LOG = logging.getLogger("optirack.containers")
LABEL_RACK = "org.optirack.rack"
LABEL_JOB = "org.optirack.job"
LABEL_GPU = "org.optirack.gpu"
LABEL_ROLE = "org.optirack.role"  # sandbox | worker | helper
LABEL_OWNER = "org.optirack.controller"  # on a helper: the controller process that ran it (ContainerDriver.instance)
HELPER_TTL = 30.0  # seconds a resolved helper digest is used before the registry is asked again
REMOVE_WAIT = 30.0  # seconds a removal already under way (another caller's) is waited for before it is an error


def container_name(job: str, gpu: str) -> str:
    return f"optirack-{job}-{gpu}"


def volume_name(job: str) -> str:
    """The job's checkpoints on one server: one volume per job and server, shared by its workers there."""
    return f"optirack-ckpt-{job}"


def sandbox_name(job: str, gpu: str) -> str:
    return f"optirack-{job}-{gpu}-net"


def _not_found(e: Exception) -> bool:
    import docker

    return isinstance(e, docker.errors.NotFound)


def _being_removed(e: Exception) -> bool:
    """The engine's 409 for a container another caller is removing ("removal of container ... is already in
    progress"), or one already marked for removal."""
    import docker

    text = str(e)
    return isinstance(e, docker.errors.APIError) and e.status_code == 409 and (
        "already in progress" in text or "marked for removal" in text)


class ContainerDriver:
    def __init__(self, rack: Rack, image: str, engines: Engines | None = None, nic_home: str = "emulated"):
        self.rack, self.image = rack, image
        self.engines = engines or Engines(rack)
        self.registry = rack.spec.engines.registry
        self.helper = rack.spec.engines.helper_image
        self.home = home_settings(rack) if nic_home == "emulated" else {}
        self._gpu_hosts: dict[str, bool] = {}
        self._helpers: dict[str, tuple[str, float]] = {}  # server -> (repo@digest, when resolved)
        self.instance = uuid.uuid4().hex[:12]  # this controller's helpers carry it: another's are orphans to sweep

    # --- engines --------------------------------------------------------------------------------
    def client(self, server: str):
        return self.engines.client(server)

    def check_engines(self, servers) -> None:
        """Raise EngineDown naming the first server whose engine does not answer."""
        self.engines.check(servers)

    def down_servers(self) -> dict[str, str]:
        return self.engines.down_servers()

    def _has_gpus(self, server: str) -> bool:
        if server not in self._gpu_hosts:
            self._gpu_hosts[server] = "nvidia" in (self.client(server).info().get("Runtimes") or {})
        return self._gpu_hosts[server]

    # --- images ---------------------------------------------------------------------------------
    def _remote(self, name: str) -> str:
        return f"{self.registry}/{name}" if self.registry else name

    def worker_image(self, server: str) -> str:
        """The worker image as repo@digest (the registry's tag resolved now), pulled if missing."""
        client, ref = self.client(server), self._remote(self.image)
        if not self.registry:
            client.images.get(ref)  # ImageNotFound names it
            return ref
        pinned = f"{ref.rsplit(':', 1)[0]}@{client.images.get_registry_data(ref).id}"
        self._ensure(client, pinned, server, ref)
        return pinned

    def helper_image(self, server: str) -> str:
        """The NIC helper as repo@digest, resolved at most every HELPER_TTL seconds. With the
        registry unreachable, the engine's own copy of the tag serves (jobs go on without it)."""
        client, ref = self.client(server), self._remote(self.helper)
        if not self.registry:
            return ref
        cached = self._helpers.get(server)
        if cached and time.monotonic() - cached[1] < HELPER_TTL:
            return cached[0]
        try:
            pinned = f"{ref.rsplit(':', 1)[0]}@{client.images.get_registry_data(ref).id}"
        except Exception as e:  # noqa: BLE001 (registry down: fall back to the engine's copy)
            try:
                client.images.get(ref)
            except Exception:  # noqa: BLE001
                raise ContainerError(f"{server}: the NIC helper {ref} is not on the engine and the registry does not "
                                     f"answer ({_text(e)})") from None
            LOG.warning("%s: registry unreachable (%s); using the engine's copy of %s", server, _text(e), ref)
            return ref
        self._ensure(client, pinned, server, ref)
        self._helpers[server] = (pinned, time.monotonic())
        return pinned

    @staticmethod
    def _ensure(client, pinned: str, server: str, tag: str) -> None:
        """Pull repo@digest if the engine lacks it, and tag it (the copy used if the registry is down)."""
        import docker

        try:
            client.images.get(pinned)
        except docker.errors.ImageNotFound:
            LOG.info("pulling %s on %s", pinned, server)
            repo, _, digest = pinned.partition("@")
            client.api.pull(repo, tag=digest)
            client.api.tag(pinned, *tag.rsplit(":", 1))

    # --- the NIC hand-over ----------------------------------------------------------------------
    def nic(self, server: str, action: str, env: dict[str, str], args: tuple[str, ...] = ()) -> str:
        """Run the helper (`optirack-nic ACTION`) on the server's engine; returns its output."""
        import docker

        client = self.client(server)
        try:
            out = client.containers.run(
                self.helper_image(server),
                [action, *args],
                environment=env,
                network_mode="host",
                pid_mode="host",
                cap_add=HELPER_CAPS,
                remove=True,
                stdout=True,
                stderr=True,
                labels={LABEL_RACK: self.rack.name, LABEL_ROLE: "helper", LABEL_OWNER: self.instance},
            )
        except docker.errors.ContainerError as e:
            err = (e.stderr or b"").decode(errors="replace").strip()
            raise ContainerError(f"{server}: optirack-nic {action} exited {e.exit_status}: {err}") from None
        return out.decode(errors="replace")

    def _nic_env(self, spec_gpu: str, ifname: str, cidr: str, netns: str, cid: str) -> dict[str, str]:
        env = {"NIC": ifname, "NETNS": netns, "CIDR": cidr, "ID": cid, "SUBNET": str(self.rack.spec.network.subnet)}
        env.update(self.home.get(spec_gpu, {}))
        return env

    # --- one GPU's containers -------------------------------------------------------------------
    def start(self, spec: GpuContainer, image: str | None = None, reuse: bool = False) -> str:
        """Sandbox, NIC, worker; returns the worker's id. All or nothing: a failure removes what was made.
        `reuse`: a running sandbox of this job and GPU is kept, with its NIC; only the worker is replaced (a restart
        from a checkpoint)."""
        import docker

        try:
            client = self.client(spec.server)
            image = image or self.worker_image(spec.server)
            labels = {LABEL_RACK: self.rack.name, LABEL_JOB: spec.job, LABEL_GPU: spec.gpu}
            volume = self._volume(client, spec.job)
            kept = self._get(client, sandbox_name(spec.job, spec.gpu)) if reuse else None
            if kept is not None and kept.status == "running":
                old = self._get(client, container_name(spec.job, spec.gpu))
                if old is not None:
                    old.remove(force=True)
                return self._run_worker(client, spec, image, kept, labels, volume)
            sandbox = client.containers.run(
                self.helper_image(spec.server),
                None,
                detach=True,
                entrypoint=["/bin/sleep", "2147483647"],
                name=sandbox_name(spec.job, spec.gpu),
                network_mode="none",
                sysctls=sandbox_sysctls(self.rack.spec.emulation.mtu if self.home else None,
                                        self.rack.spec.emulation.fabric),
                init=True,
                labels={**labels, LABEL_ROLE: "sandbox"},
            )
            sandbox.reload()
            netns = f"/proc/{sandbox.attrs['State']['Pid']}/ns/net"
            self.nic(spec.server, "add", self._nic_env(spec.gpu, spec.ifname, spec.cidr, netns, sandbox.id))
            return self._run_worker(client, spec, image, sandbox, labels, volume)
        except (docker.errors.DockerException, ContainerError, EngineDown, OSError) as e:
            LOG.error("starting the containers of %s on %s failed: %s; undoing", spec.gpu, spec.server, e)
            try:
                self.remove(spec.job, spec.gpu, spec.server)
            except Exception as undo:  # noqa: BLE001 (report the first failure; the sweep finishes the rest)
                LOG.error("undoing %s on %s: %s", spec.gpu, spec.server, undo)
            raise ContainerError(f"cannot start the container of {spec.gpu} on {spec.server}: {_text(e)}") from None

    def _run_worker(self, client, spec: GpuContainer, image: str, sandbox, labels: dict, volume: str) -> str:
        worker = client.containers.run(
            image,
            spec.command,
            detach=True,
            name=container_name(spec.job, spec.gpu),
            network_mode=f"container:{sandbox.id}",
            labels={**labels, LABEL_ROLE: "worker"},
            volumes={volume: {"bind": CHECKPOINTS, "mode": "rw"}},
            **self._gpu_args(spec),
        )
        return worker.id

    def _volume(self, client, job: str) -> str:
        """The job's checkpoint volume on this server (made once; labelled, so the sweep finds it)."""
        name = volume_name(job)
        try:
            client.volumes.get(name)
        except Exception as e:  # noqa: BLE001
            if not _not_found(e):
                raise
            client.volumes.create(name, labels={LABEL_RACK: self.rack.name, LABEL_JOB: job})
        return name

    def remove_volume(self, job: str, server: str) -> None:
        """The job's checkpoints on this server, once it ended (safe to repeat)."""
        try:
            self.client(server).volumes.get(volume_name(job)).remove(force=True)
        except Exception as e:  # noqa: BLE001
            if not _not_found(e):
                raise

    def _gpu_args(self, spec: GpuContainer) -> dict:
        import docker

        env = {
            "OPTIRACK_GPU_ID": spec.gpu,
            "OPTIRACK_GPU_INDEX": str(spec.gpu_index),
            "OPTIRACK_GPU_MODEL": spec.gpu_model,
            "OPTIRACK_IFNAME": spec.ifname,
            **spec.env,
        }
        if self._has_gpus(spec.server):
            return {
                "environment": env,
                "device_requests": [
                    docker.types.DeviceRequest(device_ids=[str(spec.gpu_index)], capabilities=[["gpu"]])
                ],
            }
        return {"environment": {**env, "NVIDIA_VISIBLE_DEVICES": "void"}}

    def remove(self, job: str, gpu: str, server: str) -> None:
        """Give the NIC back, then remove the worker and the sandbox. Safe to repeat."""
        client = self.client(server)
        sandbox = self._get(client, sandbox_name(job, gpu))
        pid = sandbox.attrs["State"]["Pid"] if sandbox is not None else 0
        ifname = self.rack.interface(gpu)
        cidr = f"{self.rack.addresses[gpu][0]}/{self.rack.spec.network.subnet.prefixlen}"
        failed = None
        try:
            self.nic(
                server,
                "del",
                self._nic_env(gpu, ifname, cidr, f"/proc/{pid or 'gone'}/ns/net", sandbox.id if sandbox else gpu),
            )
        except ContainerError as e:  # still remove the containers: nothing is left running
            failed = e
        for name in (container_name(job, gpu), sandbox_name(job, gpu)):
            self._remove_container(client, name, server)
        if failed is not None:
            raise failed

    def _remove_container(self, client, name: str, server: str) -> None:
        """Remove container `name`: gone already, or being removed by another caller, is success once it is gone;
        one still there after REMOVE_WAIT s is a ContainerError naming it and its engine."""
        c = self._get(client, name)
        try:
            if c is not None:
                c.remove(force=True)
            return
        except Exception as e:  # noqa: BLE001
            if _not_found(e):
                return
            if not _being_removed(e):
                raise
        LOG.info("container %s on %s is already being removed; waiting until it is gone", name, server)
        deadline = time.monotonic() + REMOVE_WAIT
        while self._get(client, name) is not None:
            if time.monotonic() >= deadline:
                raise ContainerError(f"container {name} on the engine of {server} is still being removed after "
                                     f"{REMOVE_WAIT:.0f} s")
            time.sleep(0.1)

    @staticmethod
    def _get(client, name: str):
        try:
            return client.containers.get(name)
        except Exception as e:  # noqa: BLE001
            if _not_found(e):
                return None
            raise

    # --- following a worker ---------------------------------------------------------------------
    def logs(self, job: str, gpu: str, server: str):
        """The worker's stdout as it comes (an iterator of byte chunks)."""
        worker = self.client(server).containers.get(container_name(job, gpu))
        return worker.logs(stream=True, follow=True, stdout=True, stderr=False)

    def regroup(self, job: str, gpu: str, server: str, attempt: int, argv: list[str]) -> None:
        """Tell a running worker to leave its ring and join the attempt's with `argv` (drivers/control.py)."""
        worker = self.client(server).containers.get(container_name(job, gpu))
        if worker.status != "running" or not worker.put_archive(CONTROL_PARENT, regroup_archive(attempt, argv)):
            raise ContainerError(f"the worker of {gpu} on {server} is {worker.status}: it cannot regroup")

    def tail(self, job: str, gpu: str, server: str, lines: int) -> list[str]:
        """The worker's last `lines` lines of output, stdout and stderr (raises if it is gone)."""
        raw = self.client(server).containers.get(container_name(job, gpu)).logs(stdout=True, stderr=True, tail=lines)
        return raw.decode(errors="replace").splitlines()[-lines:]

    def wait(self, job: str, gpu: str, server: str) -> int:
        return self.client(server).containers.get(container_name(job, gpu)).wait().get("StatusCode", -1)

    def kill(self, job: str, gpu: str, server: str) -> None:
        c = self._get(self.client(server), container_name(job, gpu))
        if c is not None and c.status == "running":
            try:
                c.kill()
            except Exception as e:  # noqa: BLE001 (exited meanwhile)
                LOG.debug("kill %s: %s", c.name, e)

    def image_of(self, job: str, gpu: str, server: str) -> str:
        """The image a worker runs, as repo@digest where the engine knows one (else its id)."""
        c = self.client(server).containers.get(container_name(job, gpu))
        ref = c.attrs["Config"]["Image"]
        return ref if "@" in ref else c.attrs["Image"]

    # --- what is on an engine -------------------------------------------------------------------
    def workers(self, server: str, job: str | None = None) -> list[dict]:
        """Our containers on the server: [{job, gpu, role, status}]."""
        labels = [f"{LABEL_RACK}={self.rack.name}"] + ([f"{LABEL_JOB}={job}"] if job else [])
        found = self.client(server).containers.list(all=True, ignore_removed=True, filters={"label": labels})
        return [
            {
                "job": c.labels.get(LABEL_JOB),
                "gpu": c.labels.get(LABEL_GPU),
                "role": c.labels.get(LABEL_ROLE),
                "status": c.status,
            }
            for c in found
        ]

    def sweep(self, server: str, keep_jobs: set[str], keep_gpus: set[tuple[str, str]] | None = None) -> list[str]:
        """Remove our containers of jobs not in `keep_jobs` (NIC given back first), of (job, GPU) pairs not in
        `keep_gpus` where given (a GPU swapped out of a job that goes on), those jobs' checkpoint volumes, and NIC
        helpers left over (_sweep_helper); returns the GPUs whose containers went."""
        found = self.workers(server)
        stale = {(w["job"], w["gpu"]) for w in found if w["job"] and (
            w["job"] not in keep_jobs or (keep_gpus is not None and (w["job"], w["gpu"]) not in keep_gpus))}
        for job, gpu in sorted(stale):
            LOG.warning("removing stale containers of %s (GPU %s) on %s", job, gpu, server)
            self.remove(job, gpu, server)
        client = self.client(server)
        ours = {"label": f"{LABEL_RACK}={self.rack.name}"}
        for c in client.containers.list(all=True, ignore_removed=True, filters=ours):
            if (c.labels or {}).get(LABEL_ROLE) == "helper":
                self._sweep_helper(client, c, server)
        for v in client.volumes.list(filters={"label": f"{LABEL_RACK}={self.rack.name}"}):
            if (v.attrs.get("Labels") or {}).get(LABEL_JOB) not in keep_jobs:
                LOG.warning("removing the stale checkpoint volume %s on %s", v.name, server)
                v.remove(force=True)
        return [g for _, g in sorted(stale)]

    def _sweep_helper(self, client, c, server: str) -> None:
        """Remove a NIC helper that has ended, or an earlier (killed) controller's: never started, or running (waited
        for up to REMOVE_WAIT s). This controller's under way are left to its calls."""
        foreign = (c.labels or {}).get(LABEL_OWNER) != self.instance
        if c.status == "running" and foreign:
            try:
                c.wait(timeout=REMOVE_WAIT)
            except Exception as e:  # noqa: BLE001 (removed with force below)
                LOG.warning("an earlier controller's helper %s on %s did not end: %s", c.name, server, _text(e))
        elif c.status not in ("exited", "dead") and not (foreign and c.status == "created"):
            return
        self._remove_container(client, c.name, server)


def _text(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[-1] if text else e.__class__.__name__

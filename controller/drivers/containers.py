"""The container driver: one container per GPU, holding exactly that GPU and that GPU's NIC.

A container starts with no Docker network. Its network namespace is pinned by name
(`optirack-c-<gpu>`), so it outlives the container's process; the GPU's NIC is moved from its
home namespace into it and addressed (the CNI host-device pattern). On a host with GPUs the
container gets a device request for exactly its GPU; elsewhere the GPU's id and model are passed
in the environment and the worker emulates it. On removal the NIC goes home before the container
goes: a veth inside a dying namespace would be destroyed, and its OCS-side peer with it. A NIC
that a crashed container took down anyway is recreated by the NIC home.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from controller.drivers import netns as ns

LOG = logging.getLogger("optirack.containers")
LABEL_RACK = "org.optirack.rack"
LABEL_JOB = "org.optirack.job"
LABEL_GPU = "org.optirack.gpu"


class ContainerError(RuntimeError):
    pass


class NicHome(Protocol):
    """Where GPU NICs live when no container holds them."""

    def netns(self, server: str) -> str | None: ...

    def restore(self, gpu: str) -> None: ...

    def adopt(self, gpu: str, netns: str, ifname: str) -> None: ...

    def recreate(self, gpu: str) -> None: ...


class HostNicHome:
    """A real server: NICs (physical ports or SR-IOV VFs) live in the root namespace."""

    def netns(self, server: str) -> str | None:
        return None

    def restore(self, gpu: str) -> None:  # the host's own network configuration takes over
        pass

    def adopt(self, gpu: str, netns: str, ifname: str) -> None:  # a real port has its own line rate
        pass

    def recreate(self, gpu: str) -> None:
        raise ContainerError(f"the NIC of {gpu} is gone from the host; it reappears when the device is reset")


@dataclass
class GpuContainer:
    """What the driver needs to start one GPU's container."""

    job: str
    gpu: str
    server: str
    gpu_index: int
    gpu_model: str
    ifname: str  # the NIC's interface name
    cidr: str  # address/prefix for the NIC
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


def pinned_netns(gpu: str) -> str:
    return f"optirack-c-{gpu}"


def container_name(job: str, gpu: str) -> str:
    return f"optirack-{job}-{gpu}"


class ContainerDriver:
    def __init__(self, rack, image: str, home: NicHome, clients: Callable[[str], object] | None = None):
        self.rack_name, self.image, self.home = rack.name, image, home
        self.engines = {s.name: s.docker for s in rack.spec.servers}
        self._clients = clients or docker_clients()
        self._gpu_hosts: dict[str, bool] = {}

    def client_for(self, server: str):
        return self._clients(self.engines[server])

    def _has_gpus(self, server: str) -> bool:
        if server not in self._gpu_hosts:
            info = self.client_for(server).info()
            self._gpu_hosts[server] = "nvidia" in (info.get("Runtimes") or {})
        return self._gpu_hosts[server]

    def start(self, spec: GpuContainer) -> str:
        """Start the container and hand it the NIC; returns the container id. All or nothing."""
        import docker

        if self.engines[spec.server] != "local":
            raise ContainerError(f"server {spec.server} uses the Docker Engine at {self.engines[spec.server]}: containers "
                                 "can be run there, but handing them a NIC needs an agent on that host, not built yet")
        client = self.client_for(spec.server)
        env = {"OPTIRACK_GPU_ID": spec.gpu, "OPTIRACK_GPU_INDEX": str(spec.gpu_index),
               "OPTIRACK_GPU_MODEL": spec.gpu_model, "OPTIRACK_IFNAME": spec.ifname, **spec.env}
        kwargs = {}
        if self._has_gpus(spec.server):
            kwargs["device_requests"] = [docker.types.DeviceRequest(device_ids=[str(spec.gpu_index)], capabilities=[["gpu"]])]
        else:
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        labels = {LABEL_RACK: self.rack_name, LABEL_JOB: spec.job, LABEL_GPU: spec.gpu}
        pin, home = pinned_netns(spec.gpu), self.home.netns(spec.server)
        container, moved = None, False
        try:
            container = client.containers.run(self.image, spec.command, name=container_name(spec.job, spec.gpu),
                                              detach=True, network_mode="none", labels=labels, environment=env,
                                              cap_add=["NET_ADMIN"], **kwargs)
            container.reload()
            pid = container.attrs["State"]["Pid"]
            if not pid:
                raise ContainerError(f"container for {spec.gpu} exited at once: {container.logs(tail=5).decode(errors='replace')}")
            ns.delete(pin)
            ns.attach(pin, pid)
            ns.move_link(spec.ifname, home, pin)
            moved = True
            ns.address(spec.ifname, pin, spec.cidr)
            self.home.adopt(spec.gpu, pin, spec.ifname)
            return container.id
        except (docker.errors.DockerException, ns.NetnsError, ContainerError) as e:
            LOG.error("starting the container of %s failed: %s; undoing", spec.gpu, e)
            self._undo(spec.gpu, spec.server, spec.ifname, container, moved)
            raise ContainerError(f"cannot start the container of {spec.gpu}: {e}") from None

    def _undo(self, gpu: str, server: str, ifname: str, container, moved: bool) -> None:
        pin = pinned_netns(gpu)
        try:
            if moved or (ns.exists(pin) and ns.has_link(ifname, pin)):
                self._hand_back(gpu, server, ifname)
        finally:
            ns.delete(pin)
            if container is not None:
                try:
                    container.remove(force=True)
                except Exception as e:  # noqa: BLE001 (already gone is fine)
                    LOG.warning("removing the container of %s: %s", gpu, e)

    def _hand_back(self, gpu: str, server: str, ifname: str) -> None:
        pin, home = pinned_netns(gpu), self.home.netns(server)
        if home is None:
            ns.move_link_to_root(ifname, pin)
        else:
            ns.move_link(ifname, pin, home)
        self.home.restore(gpu)

    def remove(self, job: str, gpu: str, server: str, ifname: str) -> None:
        """Hand the NIC back, unpin the namespace, remove the container. Safe to repeat."""
        import docker

        pin = pinned_netns(gpu)
        if ns.exists(pin) and ns.has_link(ifname, pin):
            self._hand_back(gpu, server, ifname)
        ns.delete(pin)
        if not ns.has_link(ifname, self.home.netns(server)):
            LOG.warning("the NIC of %s is gone (its container died holding it): recreating it", gpu)
            self.home.recreate(gpu)
        try:
            self.client_for(server).containers.get(container_name(job, gpu)).remove(force=True)
        except docker.errors.NotFound:
            pass

    def containers(self, server: str, job: str | None = None) -> list:
        labels = [f"{LABEL_RACK}={self.rack_name}"] + ([f"{LABEL_JOB}={job}"] if job else [])
        return self.client_for(server).containers.list(all=True, filters={"label": labels})


def docker_clients() -> Callable[[str], object]:
    """A client per Docker Engine URL ("local" is this host's engine), made on first use."""
    import docker

    cache: dict[str, object] = {}

    def client_for(url: str):
        if url not in cache:
            cache[url] = docker.from_env(timeout=120) if url == "local" else docker.DockerClient(base_url=url, timeout=120)
        return cache[url]

    return client_for

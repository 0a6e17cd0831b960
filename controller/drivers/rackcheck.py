"""Ask every server's engine, before any job runs, whether the server can run optirack's workers:
the engine answers, its GPUs and the NVIDIA runtime are there (unless the GPUs are emulated), the
NIC helper runs there with the CNI plugins, and every NIC the rack file names is on the server.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from controller.core.rack import Rack
from controller.drivers.containers import ContainerDriver
from controller.jobs.ports import ContainerError


@dataclass
class ServerCheck:
    server: str
    url: str
    ok: bool
    text: str  # what was found, or the cause of the failure

    def line(self) -> str:
        return f"{self.server:8s} {self.url:28s} {'ok' if self.ok else 'FAIL'}: {self.text}"


def check_server(driver: ContainerDriver, server: str, gpus_emulated: bool) -> ServerCheck:
    rack: Rack = driver.rack
    url, found = rack.servers[server].docker, list[str]()

    def fail(cause: str) -> ServerCheck:
        return ServerCheck(server, url, False, "; ".join([*found, cause]))

    if not driver.engines.ping(server):
        return fail(f"engine unreachable ({driver.down_servers().get(server)})")
    try:
        info = driver.client(server).info()
    except Exception as e:  # noqa: BLE001 (answered a ping, then not)
        return fail(f"engine info failed: {e}")
    found.append(f"Docker {info.get('ServerVersion', '?')}")
    gpus = [g for g in rack.servers[server].gpus]
    if gpus_emulated:
        found.append(f"GPUs emulated ({', '.join(g.name for g in gpus)})")
    elif "nvidia" not in (info.get("Runtimes") or {}):
        return fail("no NVIDIA runtime on the engine (install the NVIDIA Container Toolkit), so no GPU can be given")
    else:
        cause = _gpus_present(driver, server, [g.index for g in gpus])
        if cause:
            return fail(cause)
        found.append(f"GPUs {', '.join(str(g.index) for g in gpus)} visible")
    nics = [rack.interface(g.name) for g in gpus]
    try:
        out = driver.nic(server, "check", {}, tuple(nics))
    except ContainerError as e:
        return fail(f"NIC helper: {str(e).split(': ', 1)[-1]}")
    except Exception as e:  # noqa: BLE001 (image missing and not pullable, ...)
        return fail(f"NIC helper {driver.helper} cannot run: {e}")
    plugins = [line.split(":", 1)[0].split()[-1] for line in out.splitlines() if line.startswith("plugin ")]
    found.append(f"CNI {', '.join(plugins)}; NICs {', '.join(nics)} present")
    return ServerCheck(server, url, True, "; ".join(found))


def _gpus_present(driver: ContainerDriver, server: str, indexes: list[int]) -> str | None:
    """Run nvidia-smi (mounted in by the NVIDIA runtime) with the rack file's GPU indexes."""
    import docker

    try:
        out = driver.client(server).containers.run(
            driver.helper_image(server), None, entrypoint=["nvidia-smi", "-L"], remove=True,
            environment={"NVIDIA_DRIVER_CAPABILITIES": "utility"},
            device_requests=[docker.types.DeviceRequest(device_ids=[str(i) for i in indexes], capabilities=[["gpu"]])])
    except Exception as e:  # noqa: BLE001
        return f"GPUs {', '.join(map(str, indexes))} not usable: {str(e).strip().splitlines()[-1]}"
    listed = [line for line in out.decode(errors="replace").splitlines() if line.startswith("GPU ")]
    return (
        None
        if len(listed) == len(indexes)
        else f"nvidia-smi lists {len(listed)} GPUs, the rack file names {len(indexes)}"
    )


def check_rack(driver: ContainerDriver, gpus_emulated: bool, timeout: float = 300.0) -> list[ServerCheck]:
    """Every server at once; one that does not answer within `timeout` fails with that cause."""
    servers = list(driver.rack.servers)
    results: dict[str, ServerCheck] = {}

    def one(server: str) -> None:
        try:
            results[server] = check_server(driver, server, gpus_emulated)
        except Exception as e:  # noqa: BLE001 (a check that broke fails its server, with the reason)
            results[server] = ServerCheck(server, driver.rack.servers[server].docker, False, f"check failed: {e}")

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [
        results.get(s) or ServerCheck(s, driver.rack.servers[s].docker, False, f"no answer within {timeout:g} s")
        for s in servers
    ]

"""A whole emulated server dies, and comes back empty (`optirack-rack server kill|start SERVER`); or hangs, and wakes
(`optirack-rack server hang|wake SERVER`).

Killing a server's Docker Engine alone is not a server's death: its containers run on under containerd. `kill` ends,
with SIGKILL and by what the rack itself started (PID files and the engine's own exec root, never a process name):
the engine, its containerd, its containerd shims and the containers they run (the workers), then takes the server's
NIC ports down, so that the OCS sees each GPU's link drop, and, where Slurm runs on the rack, kills the node's slurmd
and its job steps (emulation/slurm.py). `start` brings the ports up, starts the engine, removes
every container and checkpoint volume of ours left there (the server comes back empty: nothing of the jobs it ran),
puts the GPUs' NICs back at home and starts the node's slurmd again where Slurm runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from controller.core.emulated import netns_of, nic_plans
from controller.core.rack import Rack
from emulation import engine_procs, engines, nics, procs, slurm
from emulation import netns as ns


def _server_nics(rack: Rack, server: str):
    return [n for n in nic_plans(rack) if n.server == server]


def kill(rack: Rack, plan: engines.EnginePlan) -> dict:
    """The server dies: engine, containerd, shims and containers (SIGKILL), then its NIC ports down."""
    t0 = time.monotonic()
    frozen = slurm.stop_node(plan.server)  # its Slurm ranks see nothing of what follows (killed after the ports)
    engine = engines.stop(plan, signal.SIGKILL)  # the controller's streams from it break at once
    pid = engine_procs.containerd_pid(plan)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    dropped = _drop_nics(rack, plan)  # while the containers live: their namespaces can still be entered
    shims = engine_procs.kill_shims(plan)  # and the containers they ran: a container's init takes its PID namespace
    ports = []
    for nic in _server_nics(rack, plan.server):
        ns.ip("link", "set", "dev", nic.port, "down", netns=netns_of(plan.server), check=False)
        ports.append(nic.port)
    node = slurm.kill_node(plan.server, frozen)  # after the ports: its ranks' peers hear nothing, as from a dead host
    return {"engine": engine, "containerd": pid is not None, "shims": shims, "ports_down": ports,
            "nics_dropped": dropped, "slurm": node, "seconds": time.monotonic() - t0}


def processes(plan: engines.EnginePlan) -> list[int]:
    """Every process of the server, as the rack started them (its engine's PID file, its containerd, the shims named
    by its exec root) and everything its containers run, engine first."""
    top = [p for p in (engines.pid_of(plan), engine_procs.containerd_pid(plan)) if p is not None]
    out, todo = list(top), engine_procs.shim_pids(plan)
    while todo:
        pid = todo.pop(0)
        if pid not in out:
            out.append(pid)
            todo += engine_procs.children(pid)
    return out


def hang(plan: engines.EnginePlan) -> dict:
    """The server hangs, as a wedged kernel or host looks: every process of it stopped (SIGSTOP), its links up, so
    nothing is refused and no link goes down: its engine simply does not answer, and its workers print nothing."""
    t0 = time.monotonic()
    stopped = procs.signal_all(processes(plan), signal.SIGSTOP)
    return {"stopped": stopped, "seconds": time.monotonic() - t0}


def wake(plan: engines.EnginePlan) -> dict:
    """A hung server wakes: every process of it continued (SIGCONT) where it stopped."""
    t0 = time.monotonic()
    continued = procs.signal_all(list(reversed(processes(plan))), signal.SIGCONT)
    return {"continued": continued, "seconds": time.monotonic() - t0}


def kill_containers(rack: Rack, plan: engines.EnginePlan) -> int:
    """Kill (SIGKILL) what the server's containers run, its engine alive: the first thing a host on its way down
    often shows (a cascade: its engine's daemons die a moment later, `kill`). Their NICs die with them, as in `kill`
    (left in a dying namespace, a NIC's MAC stays taken on its port). The number of processes killed."""
    _drop_nics(rack, plan)
    return procs.signal_all(engine_procs.container_inits(plan), signal.SIGKILL)


def worker_pid(rack: Rack, job: str, gpu: str) -> int:
    """The host PID of the process a job's worker container runs for `gpu` (asked of its server's engine, and checked
    to be the worker: never looked up by name)."""
    from controller.drivers.containers import container_name
    from controller.drivers.engines import engine_client

    c = engine_client(rack, rack.server_of[gpu], 30).containers.get(container_name(job, gpu))
    pid = c.attrs["State"]["Pid"]
    cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    if "containers.worker" not in cmdline:
        raise RuntimeError(f"the container of {gpu} runs {cmdline!r}, not the worker")
    return pid


def throttle(rack: Rack, job: str, gpu: str, factor: float) -> None:
    """Slow a worker's emulated GPU by `factor` (its compute phase; containers/gpu.py), as a hot or failing GPU is: a
    file handed into the worker's control directory through its engine, as the controller's commands are."""
    import io
    import tarfile

    from controller.drivers.containers import container_name
    from controller.drivers.control import CONTROL_NAME, CONTROL_PARENT
    from controller.drivers.engines import engine_client

    data, buf = f"{factor}\n".encode(), io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"{CONTROL_NAME}/slowdown")
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(data))
    c = engine_client(rack, rack.server_of[gpu], 30).containers.get(container_name(job, gpu))
    if not c.put_archive(CONTROL_PARENT, buf.getvalue()):
        raise RuntimeError(f"could not hand the slowdown to the worker of {gpu}")


def _drop_nics(rack: Rack, plan: engines.EnginePlan) -> list[str]:
    """Delete this server's GPU NICs inside its containers' namespaces: they die with the server. Left there, a
    NIC outlives its container for as long as the namespace does, and the orphaned TCP sockets of the killed workers
    keep it alive while they resend their FINs through the downed port (backing off from rto_min 500 ms, for a
    minute or more); until then its MAC is taken on the port and the NIC cannot come home when the server starts
    again ("RTNETLINK answers: Address already in use", CI of 2026-11-25)."""
    names = [n.ifname for n in _server_nics(rack, plan.server)]
    home = f"net:[{os.stat(f'/run/netns/{netns_of(plan.server)}').st_ino}]"  # NICs at home stay (ports go down)
    seen, dropped = {home}, []
    for pid in engine_procs.container_inits(plan):
        path = f"/proc/{pid}/ns/net"
        try:
            inode = os.readlink(path)
        except OSError:
            continue
        if inode in seen:
            continue
        seen.add(inode)
        for name in names:
            if subprocess.run(["nsenter", f"--net={path}", "ip", "link", "del", "dev", name], capture_output=True,
                              timeout=10).returncode == 0:
                dropped.append(name)
    return dropped


def start(rack: Rack, plan: engines.EnginePlan, label: str) -> dict:
    """The server comes back: NIC ports up, its engine started, nothing of ours left on it, NICs at home."""
    t0 = time.monotonic()
    netns = netns_of(plan.server)
    for nic in _server_nics(rack, plan.server):
        ns.ip("link", "set", "dev", nic.port, "up", netns=netns)
    if engines.pid_of(plan) is None:
        engines.start(rack, plan)  # cleans what a dead engine left: containerd, shims, task state, mounts
    engines.wait_ready(rack, plan)
    removed = engines.remove_our_containers(rack, plan, label)
    volumes = remove_our_volumes(rack, plan, label)
    for nic in _server_nics(rack, plan.server):
        _make_nic(nic, rack)
    slurmd = slurm.start_node(plan.server)
    return {"containers_removed": removed, "volumes_removed": volumes, "slurmd": slurmd,
            "seconds": time.monotonic() - t0}


def _make_nic(nic, rack: Rack, timeout: float = 30.0) -> None:
    """Make the NIC at home again on its port. The kernel destroys a dead container's namespace, and the old NIC in
    it, in the background: until it has, the new one (with the same MAC on the same port) cannot come up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            nics.make(nic, rack)
            return
        except ns.NetnsError as e:
            if "Address already in use" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def remove_our_volumes(rack: Rack, plan: engines.EnginePlan, label: str) -> int:
    from controller.drivers.engines import engine_client

    client = engine_client(rack, plan.server, timeout=30)
    import docker

    found = client.volumes.list(filters={"label": label})
    for v in found:
        try:
            v.remove(force=True)
        except docker.errors.NotFound:  # removed meanwhile (the controller sweeps a server that answers again)
            pass
    return len(found)

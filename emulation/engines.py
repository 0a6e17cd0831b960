"""One Docker Engine per emulated server, inside that server's network namespace, on a management
network, listening with mutual TLS: the emulated rack's servers are reached the way a lab's are.

A dockerd is entered into the server's namespace with `nsenter --net` (`ip netns exec` remounts
/sys and dockerd then finds no cgroups), with its own data root, exec root, PID file and config
file, and no bridge or iptables of its own. The management network is one Linux bridge in the
root namespace with a veth leg per server (two legs on one subnet without a bridge break replies).
Each engine's data root (its image store) outlives the rack as a cache; `down(purge=True)`
removes it. An engine that exits leaves mounts under its roots behind, and one that crashes its
containerd and shims too: emulation/engine_procs.py finds and ends those, and this module calls it
when an engine starts or stops.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from controller.core.emulated import RUN_DIR, netns_of  # noqa: F401 (emulation/registry.py takes RUN_DIR from here)
from controller.core.rack import Rack, RackError
from emulation import netns as ns
from emulation import pki, procs
from emulation.engine_plan import CACHE_DIR, EnginePlan  # noqa: F401 (callers take them from here)
from emulation.engine_procs import kill_shims, stop_containerd, unmount_leftovers
from emulation.procs import alive

BRIDGE = "optirack-mgmt"
LEG_IFNAME = "mgmt0"  # a server's end of its management leg
STOP_TIMEOUT = 30.0


class EngineError(RuntimeError):
    pass


def engine_plans(rack: Rack) -> list[EnginePlan]:
    """The engines rack-up starts: one per server whose engine is tcp://, all in emulation.management."""
    mgmt = rack.spec.emulation.management
    plans = []
    for i, s in enumerate(rack.spec.servers):
        if s.docker == "local":
            continue
        if not s.docker.startswith("tcp://"):
            raise RackError(rack.source, f"servers[{i}].docker", f"{s.docker}: the emulation runs tcp:// engines only")
        host, port = rack.engine_host(s.name), int(s.docker.rsplit(":", 1)[1])
        if not _in(host, mgmt) or host == bridge_ip(rack):
            raise RackError(rack.source, f"servers[{i}].docker", f"{host} is not a server address in "
                            f"emulation.management {mgmt} (the last one, {bridge_ip(rack)}, is the bridge's)")
        plans.append(EnginePlan(s.name, host, port, mgmt.prefixlen))
    if plans and rack.spec.engines.tls is None:
        raise RackError(
            rack.source, "engines.tls", "emulated engines listen with mutual TLS: name the certificate paths"
        )
    if plans and rack.spec.engines.registry and rack.spec.engines.registry.rsplit(":", 1)[0] != bridge_ip(rack):
        raise RackError(
            rack.source,
            "engines.registry",
            f"the emulated rack's registry listens on the management bridge: {bridge_ip(rack)}:PORT",
        )
    return plans


def _in(host: str, net) -> bool:
    import ipaddress

    try:
        return ipaddress.IPv4Address(host) in net
    except ValueError:
        return False


def bridge_ip(rack: Rack) -> str:
    return str(list(rack.spec.emulation.management.hosts())[-1])


# --- the management network ------------------------------------------------------------------
def make_management(rack: Rack, plans: list[EnginePlan]) -> None:
    """The bridge (with the last address of emulation.management) and one leg per server."""
    if not ns.has_link(BRIDGE, None):
        ns.ip("link", "add", BRIDGE, "type", "bridge")
    ns.ip("addr", "replace", f"{bridge_ip(rack)}/{rack.spec.emulation.management.prefixlen}", "dev", BRIDGE)
    ns.ip("link", "set", "dev", BRIDGE, "up")
    for p in plans:
        netns = netns_of(p.server)
        if ns.has_link(p.leg, None):
            ns.ip("link", "delete", "dev", p.leg)
        ns.ip("link", "add", p.leg, "type", "veth", "peer", "name", LEG_IFNAME, "netns", netns)
        ns.ip("link", "set", "dev", p.leg, "master", BRIDGE, "up")
        ns.ip("addr", "add", f"{p.ip}/{p.prefixlen}", "dev", LEG_IFNAME, netns=netns)
        ns.ip("link", "set", "dev", LEG_IFNAME, "up", netns=netns)


def remove_management(legs: list[str]) -> int:
    removed = 0
    for leg in legs:
        if ns.has_link(leg, None):
            ns.ip("link", "delete", "dev", leg, check=False)
            removed += 1
    if ns.has_link(BRIDGE, None):
        ns.ip("link", "delete", "dev", BRIDGE, check=False)
        removed += 1
    return removed


# --- certificates -------------------------------------------------------------------------------
def make_certificates(rack: Rack, plans: list[EnginePlan], registry_ip: str | None) -> None:
    tls = rack.spec.engines.tls
    ca = Path(tls.ca)
    pki.ensure_ca(ca)
    pki.ensure_client(ca, Path(tls.cert), Path(tls.key))
    for p in plans:
        pki.ensure_server(ca, p.tls_dir / "cert.pem", p.tls_dir / "key.pem", p.ip)
    if registry_ip:
        pki.ensure_server(ca, ca.with_name("registry.pem"), ca.with_name("registry-key.pem"), registry_ip)


# --- engines ------------------------------------------------------------------------------------
def pid_of(plan: EnginePlan) -> int | None:
    """The engine's dockerd PID if it is running (its PID file's, a dockerd started with that PID file)."""
    return procs.from_file(plan.pidfile, "dockerd", str(plan.pidfile))


def start(rack: Rack, plan: EnginePlan) -> int:
    """Start the engine of one server in its namespace (not waiting for it); returns its PID."""
    if pid_of(plan):
        raise EngineError(f"the engine of {plan.server} is already running (PID {pid_of(plan)})")
    # After a crash the engine's containerd may run on, logging into a pipe the dead engine no
    # longer reads (once the pipe is full it hangs, and a new engine that adopts it times out:
    # "timeout waiting for containerd to start"), or be gone while its shims run on (a new
    # containerd that reconnects to them can take longer than dockerd waits). Start clean, as a
    # restarted engine without live-restore would: the containers stop (they stay listed, exited,
    # for the controller to remove); the old containerd, its shims and their task state go.
    # After a clean stop there is nothing of the kind, and this changes nothing.
    stop_containerd(plan)
    kill_shims(plan)
    (plan.run_dir / "exec" / "containerd" / "containerd.pid").unlink(missing_ok=True)
    unmount_leftovers(plan)
    shutil.rmtree(plan.run_dir / "exec" / "containerd" / "daemon" / "io.containerd.runtime.v2.task", ignore_errors=True)
    plan.pidfile.unlink(missing_ok=True)  # a crashed engine's (dockerd refuses to start over one)
    tls = rack.spec.engines.tls
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    plan.data_root.mkdir(parents=True, exist_ok=True)
    config = plan.run_dir / "daemon.json"
    config.write_text("{}\n")  # not the host's /etc/docker/daemon.json
    cmd = [
        "nsenter",
        f"--net=/run/netns/{netns_of(plan.server)}",
        "dockerd",
        "--config-file",
        str(config),
        "--data-root",
        str(plan.data_root),
        "--exec-root",
        str(plan.run_dir / "exec"),
        "--pidfile",
        str(plan.pidfile),
        "-H",
        plan.url,
        "--tlsverify",
        "--tlscacert",
        tls.ca,
        "--tlscert",
        str(plan.tls_dir / "cert.pem"),
        "--tlskey",
        str(plan.tls_dir / "key.pem"),
        "--bridge=none",
        "--iptables=false",
        "--ip-masq=false",
        "--shutdown-timeout",
        "5",
        "--log-level",
        "warn",
    ]
    with open(plan.run_dir / "dockerd.log", "ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc.pid


def wait_ready(rack: Rack, plan: EnginePlan, timeout: float = 60.0) -> float:
    """Wait until the engine answers over TLS; returns the seconds waited."""
    from controller.drivers.engines import engine_client

    t0 = time.monotonic()
    while True:
        try:
            engine_client(rack, plan.server, timeout=5).ping()
            return time.monotonic() - t0
        except Exception as e:  # noqa: BLE001 (not listening yet)
            if time.monotonic() - t0 > timeout:
                tail = (plan.run_dir / "dockerd.log").read_text(errors="replace")[-1500:]
                raise EngineError(
                    f"the engine of {plan.server} did not answer at {plan.url} within {timeout:g} s "
                    f"({e.__class__.__name__}); its log ends:\n{tail}"
                ) from None
            time.sleep(0.1)


def stop(plan: EnginePlan, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> bool:
    """Stop a running engine (SIGKILL: crash it) and wait until it is gone. Returns whether one ran."""
    pid = pid_of(plan)
    if pid is None:
        return False
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # our own dockerd, which would not stop
            deadline += 10
        time.sleep(0.05)
    if sig != signal.SIGKILL:
        unmount_leftovers(plan)
    return True


def stop_all(plans: list[EnginePlan]) -> int:
    """Stop every running engine at once, wait for each, stop what crashed ones left, unmount.
    Returns how many were running."""
    running = {p.server: pid_of(p) for p in plans}
    for p in plans:
        if running[p.server]:
            os.kill(running[p.server], signal.SIGTERM)
    for p in plans:
        stop(p)  # waits for the process (already told to go), SIGKILL after STOP_TIMEOUT
        stop_containerd(p)
        unmount_leftovers(p)
    return sum(1 for pid in running.values() if pid)


def start_all_wait(rack: Rack, plans: list[EnginePlan], log=print) -> dict[str, float]:
    """Wait for every started engine (they start at once; waiting in turn costs nothing more);
    returns seconds to ready per server."""
    t0, waited = time.monotonic(), {}
    for p in plans:
        wait_ready(rack, p)
        waited[p.server] = time.monotonic() - t0
        log(f"  engine of {p.server} answers at {p.url} ({waited[p.server]:.1f} s)")
    return waited


def remove_our_containers(rack: Rack, plan: EnginePlan, label: str) -> int:
    """Force-remove every container of ours on a running engine (SIGKILL: a sandbox's sleep ignores TERM)."""
    from controller.drivers.engines import engine_client

    client = engine_client(rack, plan.server, timeout=30)
    found = client.containers.list(all=True, ignore_removed=True, filters={"label": label})
    for c in found:
        c.remove(force=True)
    return len(found)


def purge_cache() -> None:
    """Remove every emulated engine's image store and the registry's storage (the caches rack-down
    keeps). Only when no engine runs: rack-down calls it after stopping them."""
    for d in (CACHE_DIR / "engines", CACHE_DIR / "registry"):
        shutil.rmtree(d, ignore_errors=True)


def pull_all(rack: Rack, plans: list[EnginePlan], images: dict[str, str], log=print) -> dict[str, float]:
    """Each engine pulls each image (name -> repo@digest) it lacks, all engines at once, and tags
    it REGISTRY/NAME (its copy, should the registry be down); returns seconds per server."""
    from controller.drivers.engines import engine_client

    def pull(plan: EnginePlan) -> float:
        client, t0 = engine_client(rack, plan.server, timeout=600), time.monotonic()
        for name, ref in images.items():
            try:
                client.images.get(ref)
                continue
            except Exception as e:  # noqa: BLE001
                if e.__class__.__name__ != "ImageNotFound":
                    raise
            repo, _, digest = ref.partition("@")
            for line in client.api.pull(repo, tag=digest, stream=True, decode=True):
                if "error" in line:
                    raise EngineError(f"{plan.server} could not pull {ref}: {line['error']}")
            client.api.tag(ref, repo, name.rsplit(":", 1)[1])
        return time.monotonic() - t0

    took: dict[str, float] = {}
    errors: list[Exception] = []

    def run(plan: EnginePlan) -> None:
        try:
            took[plan.server] = pull(plan)
        except Exception as e:  # noqa: BLE001 (reported below, naming the server)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    if errors or len(took) < len(plans):
        raise EngineError(f"pulling the images: {errors[0] if errors else 'timed out after 600 s'}")
    log("  images on every engine: " + ", ".join(f"{s} {t:.1f} s" for s, t in took.items()))
    return took

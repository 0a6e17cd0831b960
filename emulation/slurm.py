"""A real Slurm on the emulated rack: munged and slurmctld on this host, one slurmd per server in
that server's network namespace under the server's own name, reaching slurmctld over the rack's
management network (the bridge's address).

Everything lives under one directory (`LAYOUT.root`: configuration, controller state, spools,
logs, the munge key and socket, the GPUs' stand-in device files), and every daemon writes a PID
file there; `stop` ends exactly those processes (and the job steps left in the rack's
namespaces), then removes the tree, so a second start finds nothing to trip on. A slurmd is
entered with `nsenter --net` and `unshare --uts` (`ip netns exec` remounts /sys and slurmd then
finds no cgroup filesystem). The GPUs are character devices made with mknod: gres/gpu needs a
device file per GPU (a GPU given by count alone registers as 0 and the node goes INVALID).
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from controller.core.circuits import CircuitMap
from controller.core.emulated import RUN_DIR, netns_of
from controller.core.rack import Rack
from controller.slurm import conf
from emulation import engines, procs, slurmdb

LAYOUT = conf.Layout(RUN_DIR / "slurm")
HOOK_LOG = LAYOUT.root / "hooks.log"
NVIDIA_MAJOR = 195  # the stand-ins carry the major number of NVIDIA's devices; nothing opens them
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


class SlurmError(RuntimeError):
    pass


def env() -> dict[str, str]:
    """The environment Slurm's commands need to find this Slurm (`SLURM_CONF`)."""
    return {**os.environ, "SLURM_CONF": str(LAYOUT.conf)}


# what Slurm's clients print when slurmctld or slurmdbd did not answer this once (busy with a reconfigure or on a
# loaded host): a read-only query that fails so is asked again; a command that changes something never is
TRANSIENT = ("Zero Bytes were transmitted or received", "Socket timed out", "Unable to contact slurm controller",
             "Connection refused", "Resource temporarily unavailable")
QUERY_ATTEMPTS = 4
QUERY_PAUSE_S = 1.0


def read_only(cmd: tuple[str, ...]) -> bool:
    """Whether `cmd` only asks (squeue, sacct, sinfo, scontrol show): safe to ask again."""
    return bool(cmd) and (cmd[0] in ("squeue", "sacct", "sinfo") or cmd[:2] == ("scontrol", "show"))


def transient(proc: subprocess.CompletedProcess) -> bool:
    out = f"{proc.stderr or ''} {proc.stdout or ''}"
    return proc.returncode != 0 and any(t in out for t in TRANSIENT)


def run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run one of Slurm's commands against this Slurm. A read-only query that Slurm's daemons left unanswered
    (`TRANSIENT`) is asked again, up to `QUERY_ATTEMPTS` times, `QUERY_PAUSE_S` apart."""
    attempts = QUERY_ATTEMPTS if read_only(cmd) else 1
    for attempt in range(attempts):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env())
        if attempt + 1 == attempts or not transient(proc):
            break
        time.sleep(QUERY_PAUSE_S)
    if check and proc.returncode != 0:
        raise SlurmError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.stdout.strip() or f'exit {proc.returncode}'}")
    return proc


@dataclass(frozen=True)
class Hook:
    """The PrologSlurmctld/EpilogSlurmctld program and what it is told: the controller."""

    program: str
    url: str | None = None
    token_file: str | None = None

    def argv(self, kind: str) -> list[str]:
        out = [self.program, kind]
        out += ["--url", self.url] if self.url else []
        return out + (["--token-file", self.token_file] if self.token_file else [])


def hook_scripts(hook: Hook | None) -> tuple[str | None, str | None]:
    """PrologSlurmctld and EpilogSlurmctld: small scripts that run `hook prolog|epilog` (Slurm runs
    a program by path, without arguments, in an environment of its own). Each notes when it started
    and ended in HOOK_LOG (bash's clock: no process started for it), which is what the prolog's cost
    is measured from (scripts/slurm_experiment.py --prolog-cost)."""
    if hook is None:
        return None, None
    paths = []
    for kind in ("prolog", "epilog"):
        path = LAYOUT.root / f"{kind}-slurmctld"
        path.write_text(f"#!/bin/bash\nt0=$EPOCHREALTIME\nexport SLURM_CONF={shlex.quote(str(LAYOUT.conf))}\n"
                        f"{shlex.join(hook.argv(kind))}\nrc=$?\n"
                        f'echo "$SLURM_JOB_ID {kind} $t0 $EPOCHREALTIME $rc" >> {shlex.quote(str(HOOK_LOG))}\n'
                        "exit $rc\n")
        path.chmod(0o755)
        paths.append(str(path))
    return paths[0], paths[1]


def hook_times() -> list[dict]:
    """What the hook scripts noted: one dict per run (job, kind, started, seconds, exit code)."""
    try:
        lines = HOOK_LOG.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        job, kind, t0, t1, rc = line.split()
        out.append({"job": job, "kind": kind, "started": float(t0), "seconds": float(t1) - float(t0), "rc": int(rc)})
    return out


def write_files(rack: Rack, hook: Hook | None = None, circuits: CircuitMap | None = None,
                topology: bool = True) -> None:
    """slurm.conf, gres.conf, topology.conf and the GPUs' device files, for the rack as it is up."""
    LAYOUT.root.mkdir(parents=True, exist_ok=True)
    LAYOUT.state.mkdir(parents=True, exist_ok=True)
    prolog, epilog = hook_scripts(hook)
    addrs = {s: rack.engine_host(s) for s in rack.servers}
    missing = [s for s, a in addrs.items() if a is None]
    if missing:
        raise SlurmError(f"servers {', '.join(missing)} have no address on the management network (a tcp:// engine)")
    LAYOUT.conf.write_text(conf.slurm_conf(rack, LAYOUT, socket.gethostname().split(".")[0],
                                           engines.bridge_ip(rack), addrs, prolog=prolog, epilog=epilog,
                                           dbd_port=slurmdb.DBD_PORT, topology=topology))
    LAYOUT.gres.write_text(conf.gres_conf(rack, LAYOUT))
    LAYOUT.topology.write_text(conf.topology_conf(rack, circuits or CircuitMap.initial(rack)))
    minor = 0
    for s in rack.spec.servers:
        (LAYOUT.node_dir(s.name) / "spool").mkdir(parents=True, exist_ok=True)
        for g in s.gpus:
            dev = LAYOUT.device(s.name, g.index)
            dev.parent.mkdir(parents=True, exist_ok=True)
            if not dev.exists():
                os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(NVIDIA_MAJOR, minor))
            minor += 1


def _pid(path: Path, name: str) -> int | None:
    """The PID in `path` if that process runs and is `name` (a stale file names nothing)."""
    return procs.from_file(path, name)


def _wait(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SlurmError(f"{what} did not come up within {timeout:g} s (logs under {LAYOUT.root})")
        time.sleep(0.2)


def start_munge() -> int:
    d = LAYOUT.munge_socket.parent
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o755)
    key = d / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    run("munged", "--force", f"--socket={LAYOUT.munge_socket}", f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
        f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}")
    _wait("munged", lambda: _pid(d / "munged.pid", "munged") and LAYOUT.munge_socket.exists(), 10)
    return _pid(d / "munged.pid", "munged")


def start_slurmd(server: str) -> None:
    """slurmd of one server, in its network namespace and its own UTS namespace named after it."""
    run("nsenter", f"--net=/run/netns/{netns_of(server)}", "unshare", "--uts", "--", "/bin/sh", "-c",
        'hostname "$1" && exec slurmd -f "$2" -N "$1"', "sh", server, str(LAYOUT.conf))


def _forward_rule() -> list[str]:
    """Servers talk to each other over the management bridge (srun in a batch script reaches the
    other nodes' slurmd, and they call back); with bridge netfilter on, Docker's FORWARD policy
    (DROP) would drop that, so the bridge forwards to itself, by a rule labelled as ours."""
    chain = "DOCKER-USER" if subprocess.run(["iptables", "-S", "DOCKER-USER"], capture_output=True).returncode == 0 \
        else "FORWARD"
    return [chain, "-i", engines.BRIDGE, "-o", engines.BRIDGE, "-m", "comment", "--comment", "optirack-slurm",
            "-j", "ACCEPT"]


def allow_forwarding() -> None:
    rule = _forward_rule()
    if subprocess.run(["iptables", "-C", *rule], capture_output=True).returncode != 0:
        run("iptables", "-I", *rule)


def remove_forwarding() -> int:
    removed = 0
    for chain in ("DOCKER-USER", "FORWARD"):
        rule = [chain, *_forward_rule()[1:]]
        while subprocess.run(["iptables", "-D", *rule], capture_output=True).returncode == 0:
            removed += 1
    return removed


def node_states() -> dict[str, str]:
    out = run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False).stdout
    return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


def start(rack: Rack, hook: Hook | None = None, log=print, topology: bool = True) -> float:
    """munged, MariaDB, slurmdbd, slurmctld and every slurmd; returns seconds until every node is idle.
    `topology`: Slurm's tree plugin on topology.conf (else no topology plugin)."""
    t0 = time.monotonic()
    if LAYOUT.root.exists():
        stop(quiet=True)
    write_files(rack, hook, topology=topology)
    allow_forwarding()
    start_munge()
    slurmdb.start(LAYOUT, socket.gethostname().split(".")[0], run, _wait, _pid)
    run("slurmctld", "-f", str(LAYOUT.conf))
    _wait("slurmctld", lambda: _pid(LAYOUT.ctld_pid, "slurmctld") and run("scontrol", "ping", check=False)
          .returncode == 0, START_TIMEOUT)
    for s in rack.servers:
        start_slurmd(s)
    _wait("every slurmd", lambda: all(st.rstrip("*") in ("idle", "mixed", "allocated")
                                      for st in (node_states().get(s, "") for s in rack.servers)), START_TIMEOUT)
    took = time.monotonic() - t0
    log(f"  Slurm up in {took:.1f} s: slurmctld on {socket.gethostname().split('.')[0]} "
        f"({engines.bridge_ip(rack)}), slurmd on {', '.join(rack.servers)}; SLURM_CONF={LAYOUT.conf}")
    return took


def daemon_pids() -> dict[str, int]:
    """name -> PID of every daemon of ours that runs (by the PID files under LAYOUT.root)."""
    found = {}
    nodes = LAYOUT.root / "nodes"
    for d in sorted(nodes.iterdir()) if nodes.is_dir() else []:
        pid = _pid(d / "slurmd.pid", "slurmd")
        if pid:
            found[f"slurmd {d.name}"] = pid
    pid = _pid(LAYOUT.ctld_pid, "slurmctld")
    if pid:
        found["slurmctld"] = pid
    found.update(slurmdb.pids(LAYOUT, _pid))
    pid = _pid(LAYOUT.munge_socket.parent / "munged.pid", "munged")
    if pid:
        found["munged"] = pid
    return found


def _steps_in(namespaces: set[int]) -> list[int]:
    """slurmstepd processes (and what they started) whose network namespace is one of the rack's."""
    steps, children = [], {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
            # Debian's binary is slurmstepd-wlm (/usr/sbin/slurmstepd links to it through the alternatives)
            if os.path.basename(os.readlink(f"/proc/{entry}/exe")).startswith("slurmstepd") \
                    and os.stat(f"/proc/{entry}/ns/net").st_ino in namespaces:
                steps.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], list(steps)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _end(pids: list[int], timeout: float) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline and procs.alive(pid):
            time.sleep(0.05)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def running() -> bool:
    """Whether our slurmctld runs (Slurm is up on the emulated rack)."""
    return _pid(LAYOUT.ctld_pid, "slurmctld") is not None


def _node(server: str) -> tuple[int | None, list[int]]:
    """The node's slurmd and every job step in the server's namespace (slurmstepd and what it started)."""
    pid = _pid(LAYOUT.node_dir(server) / "slurmd.pid", "slurmd")
    try:
        steps = _steps_in({os.stat(f"/run/netns/{netns_of(server)}").st_ino})
    except OSError:
        steps = []
    return pid, steps


def stop_node(server: str) -> tuple[int | None, list[int]]:
    """The node's processes frozen (SIGSTOP) as its server starts to die, so that none of them sees the server's NICs
    go and ends by itself (a rank whose link drops fails its collective and exits: counted, or signalled, after that,
    it is no longer there); `kill_node` ends them. What was stopped: (slurmd, steps)."""
    pid, steps = _node(server)
    procs.signal_all(([pid] if pid else []) + steps, signal.SIGSTOP)
    return pid, steps


def kill_node(server: str, stopped: tuple[int | None, list[int]] | None = None) -> dict[str, int]:
    """The node dies with its server: its slurmd and every job step in the server's namespace (slurmstepd and the
    ranks it started), by SIGKILL, as a power loss would; nothing is told to slurmctld. `stopped`: what `stop_node`
    froze (killed with whatever is found now). Nothing to do without Slurm."""
    pid, steps = _node(server)
    if stopped is not None:
        pid = pid or stopped[0]
        steps = list(dict.fromkeys(stopped[1] + steps))
    procs.signal_all(([pid] if pid else []) + steps, signal.SIGKILL)
    return {"slurmd": int(pid is not None), "steps": len(steps)}


def start_node(server: str) -> bool:
    """The server is back: its slurmd again (it registers with slurmctld, which resumes the node if it was down for
    not responding, ReturnToService=1; one the controller set DOWN waits for the controller to resume it). False
    when our Slurm is not running or the slurmd was running already."""
    if not running() or _pid(LAYOUT.node_dir(server) / "slurmd.pid", "slurmd"):
        return False
    start_slurmd(server)
    return True


def stop(quiet: bool = False, servers: list[str] | None = None, log=print) -> dict[str, int]:
    """End every job, every daemon of ours and the job steps left in the rack's namespaces; remove
    the tree. Safe to repeat, and after a crash."""
    removed = {"jobs": 0, "daemons": 0, "steps": 0}
    if not LAYOUT.root.exists():
        removed["firewall rules"] = remove_forwarding()
        return removed
    if _pid(LAYOUT.ctld_pid, "slurmctld"):
        jobs = run("squeue", "--noheader", "--format=%i", check=False).stdout.split()
        if jobs:
            run("scancel", *jobs, check=False)
            removed["jobs"] = len(jobs)
            deadline = time.monotonic() + STOP_TIMEOUT
            while time.monotonic() < deadline and run("squeue", "--noheader", "--format=%i",
                                                      check=False).stdout.strip():
                time.sleep(0.2)
    pids = daemon_pids()
    slurmds = [p for n, p in pids.items() if n.startswith("slurmd")]
    _end(slurmds, STOP_TIMEOUT)
    spaces = set()
    for s in servers if servers is not None else [d.name for d in (LAYOUT.root / "nodes").glob("*")]:
        try:
            spaces.add(os.stat(f"/run/netns/{netns_of(s)}").st_ino)
        except OSError:
            pass
    steps = _steps_in(spaces)
    _end(steps, 5)
    for name in ("slurmctld", "slurmdbd", "mariadbd", "munged"):  # each after what uses it
        _end([pids[name]] if name in pids else [], STOP_TIMEOUT)
    removed["daemons"], removed["steps"] = len(pids), len(steps)
    removed["firewall rules"] = remove_forwarding()
    shutil.rmtree(LAYOUT.root, ignore_errors=True)
    if not quiet:
        log("  Slurm stopped: " + (", ".join(f"{n} {k}" for k, n in removed.items() if n) or "nothing was running"))
    return removed

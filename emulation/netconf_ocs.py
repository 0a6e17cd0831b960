"""An emulated NETCONF OCS: yuma123's netconfd serving optirack's OCS model, and an agent that makes each committed
change on the emulated rack's OCS bridge.

netconfd (Debian's `netconfd`) keeps the cross-connects (`controller/drivers/yang/optirack-ocs.yang`) in its
datastores, checks every edit against the model, commits all or nothing, and saves the running datastore to a
startup file after each commit, as a switch keeps its cross-connects across a restart (its files on tmpfs: `store`).
It listens on a socket of its own, which clients reach through the front (`emulation.netconf_front`: the socket
ncxserver.sock, and loopback's TCP port for the driver's `tcp-ncx://` transport), which passes on a session's <hello>
apart from what follows it, as netconfd needs. The agent (`emulation.netconf_agent`) follows its running datastore
and makes each committed change on the bridge, dark first, then the new cross-connects after the switching time.

They run as processes with PID files in a run directory (`start`, `stop`), so that the rack's `down` ends exactly what
its `up` started. `python -m emulation.netconf_ocs serve` runs both in the foreground, for trying the driver.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from controller.drivers.netconf import NS, YANG
from controller.drivers.netconf_transport import SSH_PORT
from emulation import netconf_ssh, procs
from emulation.netconf_agent import USER, Agent
from emulation.netconf_ssh import listening  # noqa: F401 (the rack and the tests ask here)

NETCONFD = "netconfd"
FRONT = "emulation.netconf_front"
TMPFS = Path("/dev/shm")


def startup_xml(pairs: set[tuple[int, int]]) -> str:
    """A startup datastore holding `pairs` (the rack file's starting circuits)."""
    body = "".join(f"<pair><ingress>{a}</ingress><egress>{b}</egress></pair>" for a, b in sorted(pairs))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0">'
            f'<cross-connects xmlns="{NS}">{body}</cross-connects></config>\n')


# --- processes ---------------------------------------------------------------------------------------------------
def _pid_file(run_dir: Path, what: str) -> Path:
    return Path(run_dir) / f"{what}.pid"


def store(run_dir: Path) -> Path:
    """Where the netconfd of `run_dir` keeps its files: its startup file, the backup of running it writes at each
    confirmed commit and its --yuma-home. On tmpfs (/dev/shm), as /run is on most hosts: netconfd rewrites a backup,
    the startup file and its transaction id at every change, and on a disk file system each rewrite of a file waits
    for the writeback of the one before (docs/netconf-ocs.md). They live as long as the run directory (`forget`)."""
    run_dir = Path(run_dir).resolve()
    return TMPFS / f"optirack-netconfd{str(run_dir).replace('/', '-')}" if TMPFS.is_dir() else run_dir


def startup_file(run_dir: Path) -> Path:
    return store(run_dir) / "startup-cfg.xml"


def start_server(run_dir: Path, startup: set[tuple[int, int]] | None = None, timeout: float = 15,
                 ssh_port: int = SSH_PORT) -> int:
    """Start netconfd with its PID file and log in `run_dir` and its datastore files in `store(run_dir)`, on its socket
    `run_dir`/netconfd.sock (the front's way in); `startup` (if not None) replaces what the startup file holds;
    sessions through SSH on `ssh_port` are let in. Returns its PID once it listens."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = startup_file(run_dir)
    cfg.parent.mkdir(mode=0o700, exist_ok=True)
    if startup is not None or not cfg.exists():
        cfg.write_text(startup_xml(startup or set()))
    sock = run_dir / "netconfd.sock"
    sock.unlink(missing_ok=True)
    yuma = cfg.parent / "yuma"  # --yuma-home: netconfd writes its transaction id to data/ there, not to ~/.yuma
    (yuma / "data").mkdir(parents=True, exist_ok=True)
    try:
        procs.reap(int(_pid_file(run_dir, "netconfd").read_text()))  # one of ours that was killed: no zombie left
    except (OSError, ValueError):
        pass
    log = open(run_dir / "netconfd.log", "ab")
    proc = subprocess.Popen(
        [NETCONFD, f"--module={YANG}", f"--startup={cfg}", f"--ncxserver-sockname={sock}", f"--superuser={USER}",
         "--log-level=warn", "--startup-error=stop",
         "--indent=0",  # its replies, notifications and files without indentation: a quarter fewer bytes
         "--access-control=off",  # any login may change it: the controller's default too
         f"--yuma-home={yuma}", f"--port={SSH_PORT}"] + ([f"--port={ssh_port}"] if ssh_port != SSH_PORT else []),
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "HOME": str(cfg.parent)},  # and whatever else yuma keeps under $HOME/.yuma
    )
    log.close()
    return _listening(run_dir, proc, "netconfd", NETCONFD, sock, timeout)


def _listening(run_dir: Path, proc: subprocess.Popen, what: str, name: str, sock: Path, timeout: float) -> int:
    """`proc`'s PID file written; its PID once `sock` is there (it listens), else it is ended and RuntimeError
    shows the end of its log."""
    _pid_file(run_dir, what).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_pid(run_dir, what, name)
            tail = (run_dir / f"{what}.log").read_text(errors="replace")[-800:]
            raise RuntimeError(f"{what} did not listen on {sock} (see {run_dir}/{what}.log):\n{tail}")
        time.sleep(0.05)
    return proc.pid


def start_front(run_dir: Path, port: int = 0, timeout: float = 15) -> int:
    """The front (`emulation.netconf_front`) on `run_dir`/ncxserver.sock, and on 127.0.0.1:`port` if not 0, in front
    of netconfd's own socket. Returns its PID once it listens."""
    run_dir = Path(run_dir)
    sock = run_dir / "ncxserver.sock"
    sock.unlink(missing_ok=True)
    log = open(run_dir / "front.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", FRONT, "--listen", str(sock), "--netconfd",
                             str(run_dir / "netconfd.sock")] + (["--port", str(port)] if port else []),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            cwd=Path(__file__).resolve().parent.parent)
    log.close()
    return _listening(run_dir, proc, "front", FRONT, sock, timeout)


def start_agent(run_dir: Path, bridge: str | None, switching_ms: float) -> int:
    run_dir = Path(run_dir)
    log = open(run_dir / "agent.log", "ab")
    cmd = [sys.executable, "-m", "emulation.netconf_ocs", "agent", "--switching-ms", str(switching_ms),
           "--ready-file", str(run_dir / "agent.ready"), "--socket", str(run_dir / "ncxserver.sock")]
    (run_dir / "agent.ready").unlink(missing_ok=True)
    proc = subprocess.Popen(cmd + (["--bridge", bridge] if bridge else []), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            cwd=Path(__file__).resolve().parent.parent)
    log.close()
    _pid_file(run_dir, "agent").write_text(f"{proc.pid}\n")
    return proc.pid


def start(run_dir: Path, port: int, bridge: str | None, switching_ms: float,
          startup: set[tuple[int, int]] | None = None, timeout: float = 15, ssh: dict | None = None) -> None:
    """netconfd, its front on 127.0.0.1:`port` (tcp-ncx) and the agent; with `ssh` (port, user, client_keys: see
    `netconf_ssh.start`) our sshd on its port instead (`port` is not used), in front of the front's socket. Returns
    once the agent has made the bridge hold the datastore's cross-connects."""
    start_server(run_dir, startup, timeout, ssh_port=ssh["port"] if ssh else SSH_PORT)
    try:
        start_front(run_dir, 0 if ssh else port, timeout)
        if ssh:
            netconf_ssh.start(run_dir, ssh["port"], ssh["user"], ssh["client_keys"], timeout)
    except BaseException:
        stop(run_dir)
        raise
    start_agent(run_dir, bridge, switching_ms)
    deadline = time.monotonic() + timeout
    while not (Path(run_dir) / "agent.ready").exists():
        if time.monotonic() > deadline:
            stop(run_dir)
            raise RuntimeError(f"the NETCONF OCS agent did not start (see {run_dir}/agent.log)")
        time.sleep(0.05)


def stop_pid(run_dir: Path, what: str, name: str, sig: int = signal.SIGTERM, wait: float = 5) -> bool:
    """End the process a PID file of ours names (if it is still that program); True if one was running."""
    path = _pid_file(run_dir, what)
    try:
        pid = int(path.read_text())
    except (OSError, ValueError):
        return False
    procs.reap(pid)
    ran = procs.ours(pid, marker=name)
    if ran:
        os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while procs.ours(pid, marker=name) and time.monotonic() < deadline:
            procs.reap(pid)
            time.sleep(0.02)
        if procs.ours(pid, marker=name):
            os.kill(pid, signal.SIGKILL)
            while procs.ours(pid, marker=name) and time.monotonic() < deadline + 2:
                procs.reap(pid)
                time.sleep(0.02)
        procs.reap(pid)
    path.unlink(missing_ok=True)
    return ran


def stop(run_dir: Path) -> int:
    """End the agent, our sshd and its sessions, the front, then netconfd; returns how many were running."""
    ended = stop_pid(run_dir, "agent", "emulation.netconf_ocs")
    sshd = netconf_ssh.sshd_pid(run_dir)
    if sshd is not None:
        for child in _children(sshd):  # its sessions (and their netconf-subsystem) outlive the listener
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
    ended += stop_pid(run_dir, "sshd", str(Path(run_dir) / "sshd_config"))
    ended += stop_pid(run_dir, "front", FRONT)
    return ended + stop_pid(run_dir, "netconfd", NETCONFD)


def forget(run_dir: Path) -> None:
    """Remove what a stopped NETCONF OCS leaves: its datastore files (`store`) and its run directory."""
    shutil.rmtree(store(run_dir), ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m emulation.netconf_ocs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "agent"):
        s = sub.add_parser(name, help="netconfd and the agent, in the foreground" if name == "serve" else
                           "the agent alone (netconfd already runs)")
        s.add_argument("--port", type=int, default=8830, help="the front's TCP port on 127.0.0.1 (default %(default)s)")
        s.add_argument("--socket", type=Path, help="the front's socket, where SSH's sessions come in (not --port)")
        s.add_argument("--bridge", help="make cross-connects on this OVS bridge as flows")
        s.add_argument("--switching-ms", type=float, default=25.0,
                       help="time to make cross-connects (default %(default)s)")
        s.add_argument("--ready-file", type=Path, help=argparse.SUPPRESS)
        if name == "serve":
            s.add_argument("--run-dir", type=Path, default=Path("/tmp/optirack-netconf-ocs"),
                           help="netconfd's files (default %(default)s)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    agent = Agent(args.port, args.bridge, args.switching_ms, args.socket)
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    if args.cmd == "serve":
        start_server(args.run_dir)
        start_front(args.run_dir, args.port)
        agent.socket = args.run_dir / "ncxserver.sock"
        print(f"NETCONF OCS on 127.0.0.1:{args.port} (tcp-ncx), files in {args.run_dir}", flush=True)
    try:
        agent.follow(args.ready_file)
    except KeyboardInterrupt:
        pass
    finally:
        if args.cmd == "serve":
            stop_pid(args.run_dir, "front", FRONT)
            stop_pid(args.run_dir, "netconfd", NETCONFD)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

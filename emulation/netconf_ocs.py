"""An emulated NETCONF OCS: yuma123's netconfd serving optirack's OCS model, and an agent that makes each committed
change on the emulated rack's OCS bridge.

netconfd (Debian's `netconfd`) keeps the cross-connects (`controller/drivers/yang/optirack-ocs.yang`) in its
datastores, checks every edit against the model, commits all or nothing, and saves the running datastore to a
startup file after each commit, as a switch keeps its cross-connects across a restart. It listens on a socket of its
own, which clients reach through the front (`emulation.netconf_front`: the socket ncxserver.sock, and loopback's TCP
port for the driver's `tcp-ncx://` transport), which passes on a session's <hello> apart from what follows it, as
netconfd needs. The agent holds a NETCONF session of its own, subscribed to the
server's notifications: on each `netconf-config-change` (and on every (re)connect) it makes the bridge hold exactly
the running datastore's cross-connects, as flows both ways: the changed ports' flows go at once (dark), the new ones
after the switching time. The ports the notification's edits name go dark at once, and the datastore is read only
once the switching time is over (so that its read does not compete with the controller's read-back of the commit);
a notification that names no pair (or a rollback's) has the datastore read at once and the difference made dark.
Without a bridge it only follows the datastore (for tests).

They run as processes with PID files in a run directory (`start`, `stop`), so that the rack's `down` ends exactly what
its `up` started. `python -m emulation.netconf_ocs serve` runs both in the foreground, for trying the driver.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from xml.etree import ElementTree as ET

from controller.drivers.netconf import FILTER, NS, YANG, parse_pairs
from controller.drivers.netconf_transport import SSH_PORT, Address, connect
from emulation import netconf_ssh, procs
from emulation.netconf_ssh import listening  # noqa: F401 (the rack and the tests ask here)
from emulation.ovs import circuit_cookie

LOG = logging.getLogger("optirack.netconf-ocs")
USER = "optirack"  # the session user netconfd lets change its datastores (--superuser)
COOKIE = "0x0c/0xff"  # the circuit flows, each with its per-port cookie (controller.drivers.openflow.circuit_cookie)
PRIORITY = 100
NETCONFD = "netconfd"
FRONT = "emulation.netconf_front"
TIMING = "timing"  # the agent's log line for each change it makes (scripts/bench_reconfig.py reads it)
# netconfd's netconf-confirmed-commit notification when it undoes a commit nobody confirmed (RFC 6470): no
# netconf-config-change comes with it
ROLLED_BACK = re.compile(r"<confirm-event>\s*(timeout|cancel)\s*</confirm-event>")
PAIR_TARGET = re.compile(r"/(?:\w+:)?cross-connects/(?:\w+:)?pair\[(?:\w+:)?ingress\s*=\s*['\"]?(\d+)['\"]?\]")


def changed_ingress(notification_xml: str) -> set[int] | None:
    """The ingress ports of the pairs a `netconf-config-change` notification's edits name (RFC 6470: each edit's
    target, an instance identifier); None when it names none, or something other than pairs (the whole container):
    then only the datastore says what changed."""
    try:
        root = ET.fromstring(notification_xml)
    except ET.ParseError:
        return None
    targets = [e.text or "" for e in root.iter() if e.tag.rsplit("}", 1)[-1] == "target"]
    ports = set()
    for target in targets:
        m = PAIR_TARGET.match(target.strip())
        if m is None:
            return None
        ports.add(int(m.group(1)))
    return ports or None


def startup_xml(pairs: set[tuple[int, int]]) -> str:
    """A startup datastore holding `pairs` (the rack file's starting circuits)."""
    body = "".join(f"<pair><ingress>{a}</ingress><egress>{b}</egress></pair>" for a, b in sorted(pairs))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0">'
            f'<cross-connects xmlns="{NS}">{body}</cross-connects></config>\n')


# --- processes ---------------------------------------------------------------------------------------------------
def _pid_file(run_dir: Path, what: str) -> Path:
    return Path(run_dir) / f"{what}.pid"


def start_server(run_dir: Path, startup: set[tuple[int, int]] | None = None, timeout: float = 15,
                 ssh_port: int = SSH_PORT) -> int:
    """Start netconfd with its files in `run_dir`, on its socket `run_dir`/netconfd.sock (the front's way in);
    `startup` (if not None) replaces what the startup file holds; sessions through SSH on `ssh_port` are let in.
    Returns its PID once it listens."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = run_dir / "startup-cfg.xml"
    if startup is not None or not cfg.exists():
        cfg.write_text(startup_xml(startup or set()))
    sock = run_dir / "netconfd.sock"
    sock.unlink(missing_ok=True)
    yuma = run_dir / "yuma"  # --yuma-home: netconfd writes its transaction id to data/ there, not to ~/.yuma
    (yuma / "data").mkdir(parents=True, exist_ok=True)
    try:
        procs.reap(int(_pid_file(run_dir, "netconfd").read_text()))  # one of ours that was killed: no zombie left
    except (OSError, ValueError):
        pass
    log = open(run_dir / "netconfd.log", "ab")
    proc = subprocess.Popen(
        [NETCONFD, f"--module={YANG}", f"--startup={cfg}", f"--ncxserver-sockname={sock}", f"--superuser={USER}",
         "--log-level=warn", "--startup-error=stop",
         "--access-control=off",  # any login may change it: the controller's default too
         f"--yuma-home={yuma}", f"--port={SSH_PORT}"] + ([f"--port={ssh_port}"] if ssh_port != SSH_PORT else []),
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "HOME": str(run_dir)},  # and whatever else yuma keeps under $HOME/.yuma
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


# --- the agent ---------------------------------------------------------------------------------------------------
class Agent:
    """Follows the server's running datastore and makes the bridge hold its cross-connects."""

    def __init__(self, port: int, bridge: str | None, switching_ms: float, socket: Path | None = None):
        self.port, self.bridge, self.switching_s = port, bridge, switching_ms / 1000.0
        self.socket = socket  # netconfd's own socket, where it serves SSH's sessions and not a TCP port
        self.held: set[tuple[int, int]] | None = None  # what the bridge holds (None: not read yet)
        self.stopping = threading.Event()

    def _ofctl(self, *args: str, stdin: str | None = None) -> str:
        return subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args], input=stdin, check=True, capture_output=True,
                              text=True).stdout

    def read_bridge(self) -> set[tuple[int, int]]:
        if not self.bridge:
            return set()
        flows = {}
        for line in self._ofctl("dump-flows", self.bridge, f"cookie={COOKIE}").splitlines():
            fields = dict(f.split("=", 1) for f in line.replace(", ", ",").replace(" ", ",").split(",") if "=" in f)
            if "in_port" in fields and fields.get("actions", "").startswith("output:"):
                flows[int(fields["in_port"])] = int(fields["actions"].split(":", 1)[1])
        return {(min(a, b), max(a, b)) for a, b in flows.items() if flows.get(b) == a}

    def _unflow(self, ports: set[int], held: set[tuple[int, int]]) -> None:
        """The circuit flows out of `ports` go, in one bundle; when they are every port the bridge's circuits hold (a
        change of all of them), by one deletion of every circuit flow (their cookie), which OVS does at a fraction of
        the cost of one deletion a port."""
        if not self.bridge or not ports:
            return
        if ports >= {p for pair in held for p in pair}:
            self._ofctl("del-flows", self.bridge, f"cookie={COOKIE}")
        else:
            self._ofctl("--bundle", "add-flows", self.bridge, "-",
                        stdin="".join(f"delete_strict priority={PRIORITY},in_port={p}\n" for p in sorted(ports)))

    def darken(self, ingress: set[int]) -> tuple[set[int], float]:
        """The flows of these ingress ports, and of every pair the bridge holds on one of them, go at once (dark),
        before the datastore is read. Returns the ports made dark and how long it took (ms)."""
        t0 = time.monotonic()
        held = self.held if self.held is not None else self.read_bridge()
        touched = {pair for pair in held if ingress & set(pair)}
        ports = set(ingress) | {p for pair in touched for p in pair}
        self._unflow(ports, held)
        self.held = held - touched
        return ports, 1000 * (time.monotonic() - t0)

    def make(self, want: set[tuple[int, int]], start: float | None = None, dark: frozenset[int] = frozenset()
             ) -> dict[str, float]:
        """Dark first (the changed ports' flows go, but for the ports `dark` that `darken` made dark already), the
        switching time (counted from `start`, a monotonic time, else now), then the new cross-connects' flows; returns
        how long each step took (ms)."""
        t0 = time.monotonic()
        start = t0 if start is None else start
        held = self.held if self.held is not None else self.read_bridge()
        gone, new = held - want, want - held
        took = {"dark_flows_ms": 0.0, "switching_wait_ms": 0.0, "new_flows_ms": 0.0}
        if gone or new:
            LOG.info("cross-connects: -%d +%d", len(gone), len(new))
        ports = {p for pair in gone | new for p in pair} - dark
        if self.bridge and ports:
            self._unflow(ports, held)
            took["dark_flows_ms"] = 1000 * (time.monotonic() - t0)
        if new:
            wait = max(0.0, self.switching_s - (time.monotonic() - start))
            time.sleep(wait)  # the mirrors move
            took["switching_wait_ms"] = 1000 * wait
            t1 = time.monotonic()
            if self.bridge:
                self._ofctl("--bundle", "add-flows", self.bridge, "-", stdin="".join(
                    f"cookie={circuit_cookie(x):#x},priority={PRIORITY},in_port={x},actions=output:{y}\n"
                    for a, b in sorted(new) for x, y in ((a, b), (b, a))))
            took["new_flows_ms"] = 1000 * (time.monotonic() - t1)
        self.held = want
        return took

    def _follow(self, m, why: str, ingress: set[int] | None = None) -> None:
        """The datastore changed (`why`; at the pairs of these ingress ports, if known): make the bridge hold it; one
        timing line in the log (the benchmark's). Known ports go dark at once and the datastore is read once the
        switching time is over; else it is read at once."""
        t0, start = time.time(), time.monotonic()
        dark, dark_ms = self.darken(ingress) if ingress is not None else (set(), 0.0)
        if ingress is not None:
            time.sleep(max(0.0, self.switching_s - (time.monotonic() - start)))  # the mirrors move meanwhile
        read = time.time()
        want = self._running(m)
        got = time.time()
        took = self.make(want, start, frozenset(dark))
        took["dark_flows_ms"] += dark_ms
        LOG.info("%s %s", TIMING, json.dumps({"why": why, "notified": t0, "get_config_ms": 1000 * (got - read),
                                              **took, "done": time.time()}))

    def follow(self, ready_file: Path | None = None) -> None:
        """Until stopped: connect (retrying while the server is down), make the bridge match, then again on every
        config-change notification."""
        delay = 0.1
        while not self.stopping.is_set():
            try:
                where = Address("tcp-ncx", str(self.socket), 0) if self.socket else Address("tcp-ncx", "127.0.0.1",
                                                                                              self.port)
                m = connect(where, USER, timeout=10)
            except Exception as e:  # noqa: BLE001 (the server is down or starting: try again)
                LOG.debug("cannot reach netconfd: %s", e)
                self.stopping.wait(delay)
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.1
            try:
                m.create_subscription()
                self.make(self._running(m))
                if ready_file is not None:
                    ready_file.touch()
                while not self.stopping.is_set() and m.connected:
                    n = m.take_notification(block=True, timeout=0.5)
                    if n is None:
                        continue
                    if "netconf-config-change" in n.notification_xml:
                        self._follow(m, "config-change", changed_ingress(n.notification_xml))
                    elif (undone := ROLLED_BACK.search(n.notification_xml)) is not None:
                        LOG.info("netconfd undid an unconfirmed commit (%s)", undone.group(1))
                        self._follow(m, f"confirmed-commit {undone.group(1)}")
            except Exception as e:  # noqa: BLE001 (a lost session: reconnect and read the datastore again)
                LOG.warning("session to netconfd lost: %s: %s", type(e).__name__, e)
            finally:
                try:
                    m.close_session() if m.connected else None
                except Exception:  # noqa: BLE001
                    pass

    @staticmethod
    def _running(m) -> set[tuple[int, int]]:
        return parse_pairs(m.get_config(source="running", filter=("subtree", FILTER)).data_ele)


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

"""The emulated NETCONF OCS's agent: it holds a NETCONF session of its own to netconfd, subscribed to the server's
notifications, and on each `netconf-config-change` (and on every (re)connect) makes the emulated rack's OCS bridge hold
exactly the running datastore's cross-connects, as flows both ways: the changed ports' flows go at once (dark), the new
ones after the switching time. The ports the notification's edits name go dark at once, and the datastore is read only
once the switching time is over (so that its read does not compete with the controller's read-back of the commit); a
notification that names no pair (or a rollback's) has the datastore read at once and the difference made dark.
Without a bridge it only follows the datastore (for tests). `emulation.netconf_ocs` starts it as a process."""
from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from pathlib import Path
from xml.etree import ElementTree as ET

from controller.drivers.netconf import FILTER, parse_pairs
from controller.drivers.netconf_transport import Address, connect
from emulation.ovs import circuit_cookie

LOG = logging.getLogger("optirack.netconf-ocs")
USER = "optirack"  # the session user netconfd lets change its datastores (--superuser)
COOKIE = "0x0c/0xff"  # the circuit flows, each with its per-port cookie (controller.drivers.openflow.circuit_cookie)
PRIORITY = 100
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

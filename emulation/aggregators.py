"""The emulated rack's in-network aggregators: for each switch whose rack file entry has one, a namespace of its own
(optirack-<switch>-agg) on a veth to the switch's aggregator port, unshaped (it stands for the aggregation engine
inside the switch), addressed on the rack's network, running optirack-aggregator (containers/aggregator.py).

Started by rack-up once the bridges exist and stopped by rack-down, which also removes the namespace and the port
(both named in the rack's state, like every other thing a rack made)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from controller.core import aggregators as agg
from controller.core.emulated import RUN_DIR, netns_of, port_intf
from controller.core.rack import Rack
from emulation import netns as ns
from emulation import ovs

INSIDE = "agg0"  # the aggregator's interface in its namespace
START_S = 10.0  # seconds the aggregator has to say it listens


class AggregatorError(RuntimeError):
    pass


def _log_file(a: agg.Aggregator) -> Path:
    return RUN_DIR / f"aggregator-{a.switch}.log"  # removed at rack-down


def start(rack: Rack, state) -> None:
    """Attach and start every aggregator of the rack file; records each (namespace, port, PID) in `state` first."""
    agg.check(rack)
    mtu = str(rack.spec.emulation.mtu)
    prefix = rack.spec.network.subnet.prefixlen
    for a in agg.aggregators(rack):
        netns, outside = netns_of(a.node), port_intf(a.switch, a.port)
        state.aggregators[a.switch] = {"netns": netns, "port": outside, "pid": None, "address": a.address}
        state.save()
        ns.run("ip", "netns", "add", netns)
        ns.ip("link", "add", outside, "mtu", mtu, "type", "veth", "peer", "name", INSIDE, "mtu", mtu, "netns", netns)
        ovs.vsctl("add-port", a.switch, outside, "--", "set", "interface", outside, f"ofport_request={a.port}",
                  f"mtu_request={mtu}")
        ns.ip("link", "set", "dev", outside, "up")
        ns.run("ethtool", "-K", outside, "tx", "off", check=False)
        ns.ip("link", "set", "dev", "lo", "up", netns=netns)
        ns.address(INSIDE, netns, f"{a.ip}/{prefix}")
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        log = _log_file(a).open("w")
        proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-m", "containers.aggregator",
                                 "--listen", a.address, "--jobs", str(a.jobs), "--capacity-bytes",
                                 str(a.capacity_bytes)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=str(Path(__file__).resolve().parents[1]))
        log.close()
        state.aggregators[a.switch]["pid"] = proc.pid
        state.save()
        _wait_listening(a, proc)


def _wait_listening(a: agg.Aggregator, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        text = _log_file(a).read_text()
        if text.startswith("{"):
            first = json.loads(text.splitlines()[0])
            if first.get("event") == "listening":
                return
        if proc.poll() is not None:
            raise AggregatorError(f"the aggregator of {a.switch} ended (exit {proc.returncode}): {text.strip()}")
        time.sleep(0.05)
    raise AggregatorError(f"the aggregator of {a.switch} did not listen on {a.address} in {START_S:g} s")


def _ours(pid: int) -> bool:
    try:
        return b"containers.aggregator" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop(state) -> int:
    """End the aggregators this rack started, remove their ports and namespaces; returns how many were ended."""
    ended = 0
    for switch, entry in state.aggregators.items():
        pid = entry.get("pid")
        if pid and _ours(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while _ours(pid) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.05)
            if _ours(pid):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
            ended += 1
        if ns.has_link(entry["port"], None):
            ns.run("ip", "link", "delete", "dev", entry["port"], check=False)
        if ns.exists(entry["netns"]):
            ns.delete(entry["netns"])
        (RUN_DIR / f"aggregator-{switch}.log").unlink(missing_ok=True)
    return ended


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # our child when the same process started it (a test's rack-up)
    except ChildProcessError:
        pass

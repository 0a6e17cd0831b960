"""Where the emulated fabric drops packets: every counter that can show it, read before and after a run.

A lossless fabric (emulation.fabric: lossless) must show no drop at any of these; the droptail one
shows its uplink queue's. Read here, for the rack's interfaces only:
- every qdisc and every class of every interface, in the root namespace (the OCS, aggregator and
  uplink ports) and in each server's namespace (the NICs' ports): `tc -s`;
- every interface's receive and transmit drops: `ip -s link`;
- Open vSwitch's packet sockets (its one transmit socket and one receive socket per port):
  `ss -0 -m -p`, the `d` of each socket's memory line;
- the host's per-CPU backlog drops (veth and every other device): /proc/net/softnet_stat.
And, by `TcpSampler`, each container namespace's TcpRetransSegs and TcpOutSegs (from a process of
its sandbox, polled while it lives: the last reading before the namespace goes).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

from controller.core.emulated import NETNS_PREFIX


def _run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    return proc.stdout if proc.returncode == 0 else ""


def _json(*cmd: str) -> list:
    try:
        return json.loads(_run(*cmd) or "[]")
    except ValueError:
        return []


def _namespaces() -> list[str | None]:
    names = [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]
    return [None, *sorted(n for n in names if n.startswith(NETNS_PREFIX))]


def _ns(netns: str | None) -> list[str]:
    return ["-n", netns] if netns else []


def queue_drops(root_intfs: set[str]) -> dict[str, int]:
    """Drops of every qdisc and class: 'NETNS DEV qdisc|class HANDLE' -> packets dropped so far."""
    out: dict[str, int] = {}
    for netns in _namespaces():
        where = netns or "root"
        for kind in ("qdisc", "class"):
            for q in _json("tc", *_ns(netns), "-s", "-j", kind, "show"):
                dev = q.get("dev", "?")
                if netns is None and dev not in root_intfs:
                    continue
                out[f"{where} {dev} {kind} {q.get('handle', q.get('class', '?'))}"] = int(q.get("drops", 0))
    return out


def link_drops(root_intfs: set[str]) -> dict[str, int]:
    """'NETNS DEV rx|tx' -> packets the interface dropped so far."""
    out: dict[str, int] = {}
    for netns in _namespaces():
        for link in _json("ip", *_ns(netns), "-s", "-j", "link", "show"):
            dev = link.get("ifname", "?")
            if netns is None and dev not in root_intfs:
                continue
            stats = link.get("stats64", link.get("stats", {}))
            for way in ("rx", "tx"):
                out[f"{netns or 'root'} {dev} {way}"] = int(stats.get(way, {}).get("dropped", 0))
    return out


_SKMEM = re.compile(r"skmem:\(([^)]*)\)")
_INODE = re.compile(r"ino:(\d+)")


def ovs_socket_drops() -> dict[str, int]:
    """ovs-vswitchd's packet sockets: 'ovs packet socket INODE' -> packets it dropped so far."""
    out: dict[str, int] = {}
    entries: list[str] = []
    for line in _run("ss", "-0", "-a", "-m", "-p", "-e", "-n").split("\n"):
        if line[:1].isspace() and entries:
            entries[-1] += " " + line.strip()  # a socket's details continue on indented lines
        else:
            entries.append(line)
    for line in entries:
        if "ovs-vswitchd" not in line:
            continue
        m, ino = _SKMEM.search(line), _INODE.search(line)
        if not m:
            continue
        fields = dict(re.match(r"([a-z]+)(\d+)", f).groups() for f in m.group(1).split(",") if re.match(r"[a-z]+\d", f))
        key = ino.group(1) if ino else str(len(out))
        out[f"ovs packet socket {key}"] = int(fields.get("d", 0))
    return out


def softnet_drops() -> dict[str, int]:
    """'softnet cpuN' -> packets the CPU's backlog dropped so far (second column, hex)."""
    lines = Path("/proc/net/softnet_stat").read_text().split("\n")
    return {f"softnet cpu{i}": int(line.split()[1], 16) for i, line in enumerate(lines) if line.strip()}


def snapshot(root_intfs: list[str]) -> dict[str, int]:
    intfs = set(root_intfs)
    return {**queue_drops(intfs), **link_drops(intfs), **ovs_socket_drops(), **softnet_drops()}


def drops_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that grew from `before` to `after` (a counter new in `after` counts from 0)."""
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v > before.get(k, 0)}


TCP_EXT = ("TCPTimeouts", "TCPLossProbes", "TCPSpuriousRTOs", "TCPSackRecovery", "TCPRenoRecovery",
           "TCPSynRetrans", "TCPLostRetransmit", "TCPFastRetrans", "TCPSlowStartRetrans",
           # a receiver's own drops, and reordering (a retransmission that was not needed)
           "PruneCalled", "RcvPruned", "OfoPruned", "TCPBacklogDrop", "TCPRcvQDrop", "TCPOFODrop", "TCPOFOQueue",
           "TCPZeroWindowDrop", "TCPSACKReorder", "TCPTSReorder", "TCPDSACKRecv", "TCPDSACKUndo", "TCPLossUndo")


def _rows(path: str, prefix: str) -> dict[str, int]:
    lines = [line.split() for line in Path(path).read_text().split("\n") if line.startswith(prefix)]
    return {k: int(v) for k, v in zip(lines[0][1:], lines[1][1:], strict=True)}


def _tcp(pid: str) -> dict[str, int] | None:
    """TcpRetransSegs and TcpOutSegs of the process's namespace, and the TcpExt counters that say why."""
    try:
        tcp = _rows(f"/proc/{pid}/net/snmp", "Tcp:")
        ext = _rows(f"/proc/{pid}/net/netstat", "TcpExt:")
        return {"retrans": tcp["RetransSegs"], "out": tcp["OutSegs"], **{k: ext[k] for k in TCP_EXT if k in ext}}
    except (OSError, IndexError, KeyError, ValueError):
        return None


def _nics(pid: str) -> list[str]:
    try:
        rows = Path(f"/proc/{pid}/net/dev").read_text().split("\n")[2:]
    except OSError:
        return []
    return sorted(r.split(":")[0].strip() for r in rows if ":" in r and r.split(":")[0].strip() != "lo")


class TcpSampler:
    """Polls every container sandbox's namespace (a process `sleep 2147483647`, the sandbox of
    controller.drivers.containers) for its TCP segment counters; keeps each namespace's last reading,
    named by its NICs (a GPU's NIC carries the GPU's name)."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.latest: dict[int, dict] = {}  # netns inode -> {"nics", "retrans", "out"}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> TcpSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "cmdline").read_bytes() != b"/bin/sleep\x002147483647\x00":
                    continue
                inode = (proc / "ns" / "net").stat().st_ino
            except OSError:
                continue
            tcp, nics = _tcp(proc.name), _nics(proc.name)
            if tcp and nics:
                now = time.time()
                history = self.latest.get(inode, {}).get("history", [])
                history.append((now, tcp["retrans"]))
                self.latest[inode] = {"nics": nics, **tcp, "t": now, "history": history}

    def take(self) -> list[dict]:
        """The namespaces read since the last take, and forget them."""
        self.sample()
        out, self.latest = list(self.latest.values()), {}
        return out


MAX_RETRANS = 0.01  # retransmitted segments above this share of those sent fail a run


def dark_retransmissions(tcp: list[dict], dark: list[tuple[float, float]], margin: float = 1.0) -> None:
    """Set each namespace's `retrans_dark`: the retransmissions counted between two readings of which
    one falls in an OCS dark window (`dark`: wall-clock spans, widened by `margin` seconds), where
    the circuits of a job beside were being changed and packets in flight on them were lost."""
    for t in tcp:
        history, extra = t.pop("history", []), 0
        for (a, ra), (b, rb) in zip(history, history[1:], strict=False):
            if any(a - margin <= d1 and d0 <= b + margin for d0, d1 in dark):
                extra += rb - ra
        t["retrans_dark"] = extra


def verdict(drops: dict[str, int], tcp: list[dict]) -> list[str]:
    """What is wrong with a run: each counter that dropped, each namespace that retransmitted too much
    outside the OCS dark windows (`retrans_dark`, counted apart)."""
    bad = [f"{n} packets dropped at {where}" for where, n in drops.items()]
    for t in tcp:
        retrans = t["retrans"] - t.get("retrans_dark", 0)
        if t["out"] and retrans > MAX_RETRANS * t["out"]:
            dark = f" (and {t['retrans_dark']} in OCS dark windows)" if t.get("retrans_dark") else ""
            bad.append(f"{'+'.join(t['nics'])}: {retrans} of {t['out']} TCP segments retransmitted "
                       f"({100 * retrans / t['out']:.1f} % > {100 * MAX_RETRANS:g} %){dark}")
    return bad


_IP_RULE = re.compile(r"n_bytes=(\d+),.*\bip,.*nw_dst=([0-9.]+)\s.*actions=output:\"?(\d+)")


def uplink_rule_bytes(uplinks: dict[str, set[int]]) -> dict[str, int]:
    """Bytes of every per-address IPv4 rule toward an uplink: 'SWITCH:PORT ADDRESS' -> n_bytes."""
    out = {}
    for switch, ports in uplinks.items():
        for line in _run("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", switch).splitlines():
            m = _IP_RULE.search(line)
            if m and int(m.group(3)) in ports:
                out[f"{switch}:{m.group(3)} {m.group(2)}"] = int(m.group(1))
    return out


class UplinkSampler:
    """Reads the per-address rules toward every uplink every `interval` seconds while it runs."""

    def __init__(self, uplinks: dict[str, set[int]], interval: float = 0.5):
        self.uplinks, self.interval = uplinks, interval
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> UplinkSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), uplink_rule_bytes(self.uplinks)))  # the workers' clock
            self._stop.wait(self.interval)


MAX_SHARE_ERROR = 0.10  # a crossing flow's share may differ from its max-min share by this fraction of it
ACTIVE = 0.05  # a flow sent in a window if it carried this share of the uplink's capacity there (acks do not)
BUSY = 0.8  # a window counts if the uplink carried this share of its capacity: a bottleneck, where max-min applies


def _within(t0: float, t1: float, spans: list[tuple[float, float]]) -> bool:
    return any(a <= t0 and t1 <= b for a, b in spans)


def uplink_shares(samples: list[tuple[float, dict[str, int]]], capacity_bps: float,
                  rings: list[set[str]], all_reduces: list[list[tuple[float, float]]] | None = None) -> dict:
    """Each crossing flow's share of its uplink beside its max-min share, over the windows between
    samples in which flows of at least two of `rings` (sets of NIC addresses) crossed that uplink
    and it was busy (a bottleneck).

    A flow is the bytes of one per-address rule toward an uplink (a ring's flow into that NIC). In a
    window its share is its bytes over what the uplink can carry then; its max-min share, that of a
    lossless fabric where each of the n flows active there wants more than the link gives it: the
    bytes the uplink carried in the window over n. With `all_reduces` (for each ring, the spans in
    which all its ranks were in an all-reduce) only the windows inside an all-reduce of every ring
    count: outside them a ring's flow waits on its own ring, not on the uplink, and max-min gives it
    what it asks. Each figure is the mean over the windows in which that flow was counted."""
    got: dict[str, float] = {}
    fair: dict[str, float] = {}
    seen: dict[str, int] = {}  # windows in which each flow was counted
    windows = 0
    for (t0, a), (t1, b) in zip(samples, samples[1:], strict=False):
        if all_reduces is not None and not all(_within(t0, t1, spans) for spans in all_reduces):
            continue
        cap = capacity_bps / 8 * (t1 - t0)
        by_link: dict[str, dict[str, int]] = {}
        for key, n in b.items():
            d = n - a.get(key, 0) if n >= a.get(key, 0) else n  # a re-installed rule counts from 0
            if d >= ACTIVE * cap:
                link, addr = key.split(" ")
                by_link.setdefault(link, {})[addr] = d
        for link, flows in by_link.items():
            if sum(1 for r in rings if r & flows.keys()) < 2 or sum(flows.values()) < BUSY * cap:
                continue
            windows += 1
            total = sum(flows.values())
            for addr, d in flows.items():
                key = f"{link} {addr}"
                got[key] = got.get(key, 0.0) + d / cap
                fair[key] = fair.get(key, 0.0) + total / len(flows) / cap
                seen[key] = seen.get(key, 0) + 1
    flows = {k: {"share": got[k] / seen[k], "maxmin": fair[k] / seen[k], "error": got[k] / fair[k] - 1}
             for k in sorted(got)}
    return {"windows": windows, "flows": flows}


def share_problems(shares: dict) -> list[str]:
    return [f"uplink {k.split(' ')[0]}: the flow to {k.split(' ')[1]} got {100 * f['error']:+.0f} % of its max-min "
            f"share (at most {100 * MAX_SHARE_ERROR:g} % off)" for k, f in shares["flows"].items()
            if abs(f["error"]) > MAX_SHARE_ERROR]

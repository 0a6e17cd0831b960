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
import statistics
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


_CLASS = re.compile(r"^class \S+ (\S+) ")
_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+),")
_BACKLOG = re.compile(r"backlog (\d+)b (\d+)p")


def parse_classes(text: str) -> dict[str, dict[str, int]]:
    """`tc -s class show dev DEV` -> {handle: {bytes, packets, drops, backlog_bytes, backlog_packets}}.
    Text, not `-j`: iproute2 6.1 prints htb classes as text even when asked for JSON."""
    out: dict[str, dict[str, int]] = {}
    handle = None
    for line in text.splitlines():
        m = _CLASS.match(line)
        if m:
            handle = m.group(1)
            out[handle] = {"bytes": 0, "packets": 0, "drops": 0, "backlog_bytes": 0, "backlog_packets": 0}
            continue
        if handle is None:
            continue
        if m := _SENT.search(line):
            out[handle].update(bytes=int(m.group(1)), packets=int(m.group(2)), drops=int(m.group(3)))
        if m := _BACKLOG.search(line):
            out[handle].update(backlog_bytes=int(m.group(1)), backlog_packets=int(m.group(2)))
    return out


def _devices(netns: str | None) -> list[str]:
    return [link.get("ifname", "?") for link in _json("ip", *_ns(netns), "-j", "link", "show")]


def queue_drops(root_intfs: set[str]) -> dict[str, int]:
    """Drops of every qdisc and class: 'NETNS DEV qdisc|class HANDLE' -> packets dropped so far."""
    out: dict[str, int] = {}
    for netns in _namespaces():
        where = netns or "root"
        for q in _json("tc", *_ns(netns), "-s", "-j", "qdisc", "show"):
            dev = q.get("dev", "?")
            if netns is None and dev not in root_intfs:
                continue
            out[f"{where} {dev} qdisc {q.get('handle', '?')}"] = int(q.get("drops", 0))
        for dev in _devices(netns):
            if netns is None and dev not in root_intfs:
                continue
            for handle, c in parse_classes(_run("tc", *_ns(netns), "-s", "class", "show", "dev", dev)).items():
                out[f"{where} {dev} class {handle}"] = c["drops"]
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


def _nics(pid: str) -> dict[str, tuple[int, int]]:
    """The process's namespace's interfaces but loopback, each with its (receive, transmit) drops
    since it was made (/proc/PID/net/dev: the fourth and twelfth figures)."""
    try:
        rows = Path(f"/proc/{pid}/net/dev").read_text().split("\n")[2:]
    except OSError:
        return {}
    out = {}
    for row in rows:
        name, _, figures = row.partition(":")
        f = figures.split()
        if name.strip() and name.strip() != "lo" and len(f) >= 12:
            out[name.strip()] = (int(f[3]), int(f[11]))
    return out


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
                drops = {f"{nic} {way}": n for nic, (rx, tx) in nics.items() for way, n in (("rx", rx), ("tx", tx))}
                self.latest[inode] = {"nics": sorted(nics), **tcp, "nic_drops": drops, "t": now, "history": history}

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
        if t.get("retrans"):  # when they happened, kept where there are any: (time, retransmitted so far)
            before = [(0, 0), *history]
            t["retrans_history"] = [(round(a, 3), r) for (a, r), (_, q) in zip(history, before, strict=False) if r != q]
        for (a, ra), (b, rb) in zip(history, history[1:], strict=False):
            if any(a - margin <= d1 and d0 <= b + margin for d0, d1 in dark):
                extra += rb - ra
        t["retrans_dark"] = extra


def verdict(drops: dict[str, int], tcp: list[dict]) -> list[str]:
    """What is wrong with a run: each counter that dropped, each namespace that retransmitted too much
    outside the OCS dark windows (`retrans_dark`, counted apart)."""
    bad = [f"{n} packets dropped at {where}" for where, n in drops.items()]
    for t in tcp:  # a NIC in a container: dropped since it was made (it is made for the container)
        bad += [f"{n} packets dropped at {where} (in the container of {'+'.join(t['nics'])})"
                for where, n in t.get("nic_drops", {}).items() if n]
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


_FLOWID = re.compile(r"flowid (\S+)")
_DST = re.compile(r"match ([0-9a-f]{8})/ffffffff at 16")


def leaf_addresses(dev: str) -> dict[str, str]:
    """The fair uplink's leaves (emulation/shaping.py): {leaf handle: destination address} from the
    u32 filters on `dev`; empty on a FIFO port (the droptail fabric)."""
    out, flowid = {}, None
    for line in _run("tc", "filter", "show", "dev", dev).splitlines():
        if m := _FLOWID.search(line):
            flowid = m.group(1)
        elif (m := _DST.search(line)) and flowid:
            out[flowid] = ".".join(str(int(m.group(1)[i:i + 2], 16)) for i in range(0, 8, 2))
            flowid = None
    return out


Sample = tuple[float, dict[str, int], dict[str, int] | None]  # time, bytes per flow, packets queued per flow


def uplink_leaves(devs: dict[str, str], leaves: dict[str, dict[str, str]]) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes sent and packets queued of every per-address leaf of every uplink: 'SWITCH:PORT ADDRESS' -> figure."""
    sent, queued = {}, {}
    for link, dev in devs.items():
        for handle, c in parse_classes(_run("tc", "-s", "class", "show", "dev", dev)).items():
            if handle in leaves.get(link, {}):
                key = f"{link} {leaves[link][handle]}"
                sent[key], queued[key] = c["bytes"], c["backlog_packets"]
    return sent, queued


class UplinkSampler:
    """Reads every `interval` seconds, for each uplink port, the bytes each crossing flow (one per
    destination NIC) carried and the packets it has queued there. On the lossless fabric: from the
    port's per-address htb leaves (what left the port, and its backlog). On a FIFO port (droptail):
    from the per-address OpenFlow rules toward it, with no backlog of its own (`None`).

    Why the leaves and not the rules where there are leaves: ovs-vswitchd adds the datapath's packet
    counts to its OpenFlow rules when its revalidators run, in batches, so a rule's bytes in a 0.5 s
    window are not what crossed in it (measured on two steady iperf3 flows sharing as1:10: the rules
    summed to 0.47-1.48 of the line rate per window, the leaves to 0.99-1.02)."""

    def __init__(self, uplinks: dict[str, set[int]], interval: float = 0.5):
        from controller.core.emulated import port_intf

        self.uplinks, self.interval = uplinks, interval
        self.devs = {f"{w}:{p}": port_intf(w, p) for w, ports in uplinks.items() for p in ports}
        self.leaves = {link: leaf_addresses(dev) for link, dev in self.devs.items()}
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> UplinkSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def read(self) -> Sample:
        t = time.time()  # the workers' clock
        if any(self.leaves.values()):
            sent, queued = uplink_leaves(self.devs, self.leaves)
            return t, sent, queued
        return t, uplink_rule_bytes(self.uplinks), None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.read())
            self._stop.wait(self.interval)


MAX_SHARE_ERROR = 0.10  # a crossing flow's share may differ from its max-min share by this fraction of it
# A flow is judged over at least this many windows. Whether a flow was held back in a window is read from two
# instants (its packets queued at both ends), so one window can be misread: a flow that drained in between (its
# ring waiting on a rank elsewhere) is taken as held, and its "max-min share" is then the even split it did not
# ask for. Over a run of the fitted rack a flow has 8-24 windows and every one was within 7.3 % of max-min
# (record 20261125T083703Z-ab1c61b); at NIC:uplink 1:4 the uplink is rarely a bottleneck, its runs had 2 windows
# each, and one of them misread decided a flow's figure (+-57 %, the two flows of one port swapped).
MIN_SHARE_WINDOWS = 5
ACTIVE = 0.05  # a flow sent in a window if it carried this share of the uplink's capacity there (acks do not)
BUSY = 0.8  # a window counts if the uplink carried this share of its capacity: a bottleneck, where max-min applies


def _within(t0: float, t1: float, spans: list[tuple[float, float]]) -> bool:
    return any(a <= t0 and t1 <= b for a, b in spans)


def uplink_shares(samples: list[Sample], capacity_bps: float,
                  rings: list[set[str]], all_reduces: list[list[tuple[float, float]]] | None = None) -> dict:
    """Each crossing flow's share of its uplink beside its max-min share, over the windows between
    samples in which flows of at least two of `rings` (sets of NIC addresses) crossed that uplink
    and it was busy (a bottleneck).

    A flow is what one destination NIC received over the uplink. In a window its share is its bytes
    over what the uplink can carry then. Its max-min share: a flow that had packets queued at the
    port at both ends of the window wanted more than it got (bottlenecked there), and the
    bottlenecked flows split evenly what the others left of the bytes the uplink carried; a flow
    with nothing queued asked less, and max-min gives it what it asked, up to that even split. Where
    the samples hold no backlog (a FIFO port) every flow counts as bottlenecked. With `all_reduces`
    (for each ring, the spans in which all its ranks were in an all-reduce) only the windows inside
    an all-reduce of every ring count. A flow's share and max-min share are the means over the windows in
    which it was counted; its error is the median of its windows' errors (each window's share over its
    max-min share, less 1, all kept in `window_errors`): a window misread (MIN_SHARE_WINDOWS) does not
    decide it, and a port that favours one flow (a FIFO whose flows' shares follow their round trips) is
    off in most windows, so in the median too."""
    got: dict[str, float] = {}
    fair: dict[str, float] = {}
    errs: dict[str, list[float]] = {}
    seen: dict[str, int] = {}  # windows in which each flow was counted
    windows = 0
    samples = [(t, n, q[0] if q else None) for t, n, *q in samples]  # (time, bytes) alone: no backlog known
    for (t0, a, qa), (t1, b, qb) in zip(samples, samples[1:], strict=False):
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
            total = sum(flows.values())
            held = {f for f in flows
                    if qa is None or qb is None or (qa.get(f"{link} {f}", 0) and qb.get(f"{link} {f}", 0))}
            if not held:
                continue  # nothing waited at the port: no flow was held back there
            windows += 1
            level = (total - sum(d for f, d in flows.items() if f not in held)) / len(held)
            for addr, d in flows.items():
                key = f"{link} {addr}"
                mine = level if addr in held else min(d, level)
                got[key] = got.get(key, 0.0) + d / cap
                fair[key] = fair.get(key, 0.0) + mine / cap
                seen[key] = seen.get(key, 0) + 1
                errs.setdefault(key, []).append(d / mine - 1)
    flows = {k: {"share": got[k] / seen[k], "maxmin": fair[k] / seen[k], "error": statistics.median(errs[k]),
                 "error_of_means": got[k] / fair[k] - 1, "window_errors": [round(e, 3) for e in errs[k]],
                 "windows": seen[k], "judged": seen[k] >= MIN_SHARE_WINDOWS}
             for k in sorted(got)}
    return {"windows": windows, "flows": flows}


def share_problems(shares: dict) -> list[str]:
    """Each flow judged (over MIN_SHARE_WINDOWS windows or more) that is more than MAX_SHARE_ERROR off its share."""
    return [f"uplink {k.split(' ')[0]}: the flow to {k.split(' ')[1]} got {100 * f['error']:+.0f} % of its max-min "
            f"share over {f.get('windows', '?')} windows (at most {100 * MAX_SHARE_ERROR:g} % off)"
            for k, f in shares["flows"].items()
            if f.get("judged", True) and abs(f["error"]) > MAX_SHARE_ERROR]


def unjudged_flows(shares: dict) -> list[str]:
    """Flows counted in fewer than MIN_SHARE_WINDOWS windows: their figure is kept in the record, not judged."""
    return [k for k, f in shares["flows"].items() if not f.get("judged", True)]

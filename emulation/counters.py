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

It fails closed: "zero drops" means read, and zero. A read that fails (a tool that exits non-zero, output
that does not parse, a file that cannot be read) raises `ReadError`, never returns an empty reading; a
snapshot lacks none of the interfaces and namespaces it was asked for (`snapshot(expect=...)`); and
`drops_between` keeps every counter, grown or not, so a record shows what was read.
`fabric_record` turns two snapshots (or the error that stopped one) into a run's record, the error
among its problems, never as an empty set of drops.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

from controller.core.emulated import NETNS_PREFIX


class ReadError(RuntimeError):
    """A counter could not be read: the drops it holds are unknown, not zero."""


def _run(*cmd: str, strict: bool = True) -> str:
    """The command's output; a command that fails raises ReadError (`strict=False`: returns "", for
    samplers that tolerate a missed reading, emulation/shares.py)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if strict:
            raise ReadError(f"`{' '.join(cmd)}` could not run: {exc}") from exc
        return ""
    if proc.returncode != 0:
        if strict:
            raise ReadError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()[:200]}")
        return ""
    return proc.stdout


def _json(*cmd: str) -> list:
    text = _run(*cmd)
    try:
        return json.loads(text or "[]")
    except ValueError as exc:
        raise ReadError(f"`{' '.join(cmd)}` printed no JSON: {text[:100]!r}") from exc


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
    try:
        lines = Path("/proc/net/softnet_stat").read_text().split("\n")
    except OSError as exc:
        raise ReadError(f"/proc/net/softnet_stat: {exc}") from exc
    return {f"softnet cpu{i}": int(line.split()[1], 16) for i, line in enumerate(lines) if line.strip()}


def snapshot(root_intfs: list[str], namespaces: list[str] = ()) -> dict[str, int]:
    """Every drop counter of the rack's interfaces (`root_intfs`, in the root namespace) and of every
    server namespace; raises ReadError where a read fails or where an interface of `root_intfs` or a
    namespace of `namespaces` is missing from what was read."""
    intfs = set(root_intfs)
    out = {**queue_drops(intfs), **link_drops(intfs), **ovs_socket_drops(), **softnet_drops()}
    missing = missing_from(out, root_intfs, namespaces)
    if missing:
        raise ReadError(f"the snapshot lacks {', '.join(missing[:5])}" + (f" and {len(missing) - 5} more"
                                                                          if len(missing) > 5 else ""))
    return out


def missing_from(snap: dict[str, int], root_intfs: list[str], namespaces: list[str] = ()) -> list[str]:
    """What a snapshot should hold and does not: each root interface's receive and transmit drops, a
    counter of each namespace, the host's softnet counters."""
    keys = set(snap)
    out = [f"root {dev} {way}" for dev in root_intfs for way in ("rx", "tx") if f"root {dev} {way}" not in keys]
    out += [f"namespace {n}" for n in namespaces if not any(k.startswith(f"{n} ") for k in keys)]
    if not any(k.startswith("softnet ") for k in keys):
        out.append("softnet counters")
    return out


def drops_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Every counter of `after` with what it grew since `before`, zero included: a counter new in
    `after` counts from 0, as does one that went down (its interface was made again)."""
    return {k: v - before.get(k, 0) if v >= before.get(k, 0) else v for k, v in sorted(after.items())}


def fabric_record(before: dict[str, int] | str, after: dict[str, int] | str, tcp: list[dict],
                  dark: list[tuple[float, float]] = ()) -> dict:
    """A run's fabric counters from its two snapshots, each a reading or the ReadError text that stopped
    it: {drops, errors, tcp, problems}. With an error the drops are unknown: `drops` empty, `errors`
    naming why, and the error among `problems`."""
    errors = [f"before the run: {s}" for s in (before,) if isinstance(s, str)]
    errors += [f"after the run: {s}" for s in (after,) if isinstance(s, str)]
    drops = {} if errors else drops_between(before, after)
    dark_retransmissions(tcp, list(dark))
    return {"drops": drops, "errors": errors, "tcp": tcp, "problems": verdict(drops, tcp, errors)}


def read(root_intfs: list[str], namespaces: list[str] = ()) -> dict[str, int] | str:
    """A snapshot, or the text of the ReadError that stopped it."""
    try:
        return snapshot(root_intfs, namespaces)
    except ReadError as exc:
        return str(exc)


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


def verdict(drops: dict[str, int], tcp: list[dict], errors: list[str] = ()) -> list[str]:
    """What is wrong with a run: each counter that could not be read (`errors`), each counter that dropped,
    each namespace that retransmitted too much outside the OCS dark windows (`retrans_dark`, counted apart)."""
    bad = [f"drop counters not read: {e}" for e in errors]
    bad += [f"{n} packets dropped at {where}" for where, n in drops.items() if n]
    for t in tcp:  # a NIC in a container: dropped since it was made (it is made for the container)
        bad += [f"{n} packets dropped at {where} (in the container of {'+'.join(t['nics'])})"
                for where, n in t.get("nic_drops", {}).items() if n]
        retrans = t["retrans"] - t.get("retrans_dark", 0)
        if t["out"] and retrans > MAX_RETRANS * t["out"]:
            dark = f" (and {t['retrans_dark']} in OCS dark windows)" if t.get("retrans_dark") else ""
            bad.append(f"{'+'.join(t['nics'])}: {retrans} of {t['out']} TCP segments retransmitted "
                       f"({100 * retrans / t['out']:.1f} % > {100 * MAX_RETRANS:g} %){dark}")
    return bad

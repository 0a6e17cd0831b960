"""How the crossing flows shared each uplink, against max-min: the uplink's per-flow bytes and backlog sampled
while a demo runs, and each flow's share judged against its max-min share (`make demo`'s share check).

Read from the fair uplink's per-address htb leaves on the lossless fabric (emulation/shaping.py), from the
per-address OpenFlow rules on a FIFO port (droptail). The drop and retransmission counters are in
emulation/counters.py.
"""

from __future__ import annotations

import re
import statistics
import threading
import time

from emulation import counters
from emulation.counters import parse_classes


def _run(*cmd: str) -> str:
    """A sampler's reading: a failed one is a missed sample (""), which the share check counts as unjudged."""
    return counters._run(*cmd, strict=False)

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

"""What this host carries now: a short calibration run before figures are measured on it.

An emulated rack is only as good as the CPU that forwards its packets (Open vSwitch's userspace
datapath) and shapes them. On a shared machine that CPU varies from minute to minute (CPU steal),
so every experiment first measures, on the rack it is about to use, a ring of TCP flows between
GPU NICs at home (each NIC sends to the next, all at once, as a ring all-reduce does) against the
emulated line rate, and reads the host's idle and stolen CPU from /proc/stat while they run.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from controller.core.emulated import netns_of
from controller.core.rack import Rack

GOOD_FRACTION = 0.9  # each flow of the ring should reach this share of the emulated line rate


class CpuMeter:
    """Idle and stolen CPU over an interval, from /proc/stat (all CPUs together)."""

    def __init__(self):
        self.start = self._read()
        self.idle = self.steal = None

    @staticmethod
    def _read() -> list[int]:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]

    def stop(self) -> CpuMeter:
        delta = [b - a for a, b in zip(self.start, self._read(), strict=False)]
        total = sum(delta) or 1
        self.idle = 100.0 * (delta[3] + delta[4]) / total  # idle + iowait
        self.steal = 100.0 * (delta[7] if len(delta) > 7 else 0) / total
        return self


def _ovs_cpu_seconds() -> float | None:
    """CPU time ovs-vswitchd has used so far, or None if it cannot be read."""
    try:
        pid = int(Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text())
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Calibration:
    """The outcome of one calibration run."""

    rate_mbps: float  # the emulated line rate of the NICs in the ring
    flows_mbps: list[float]  # what each flow of the ring carried
    seconds: float
    idle_percent: float
    steal_percent: float
    ovs_core_percent: float | None  # share of one core ovs-vswitchd used
    ring: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        """The slowest flow's share of the line rate: a ring all-reduce goes at its slowest flow."""
        return min(self.flows_mbps) / self.rate_mbps if self.flows_mbps else 0.0

    @property
    def ok(self) -> bool:
        return self.fraction >= GOOD_FRACTION

    def line(self) -> str:
        ovs = "" if self.ovs_core_percent is None else f", ovs-vswitchd {self.ovs_core_percent:.0f} % of a core"
        verdict = "ok" if self.ok else f"TOO SLOW (below {100 * GOOD_FRACTION:.0f} %)"
        return (
            f"calibration: a ring of {len(self.flows_mbps)} flows at {self.rate_mbps:g} Mbit/s each carried "
            f"{min(self.flows_mbps):.1f}-{max(self.flows_mbps):.1f} Mbit/s ({100 * self.fraction:.1f} % of the rate, "
            f"slowest flow) in {self.seconds:g} s; host CPU idle {self.idle_percent:.0f} %, stolen "
            f"{self.steal_percent:.1f} %{ovs}: {verdict}"
        )

    def to_json(self) -> dict:
        return {**asdict(self), "fraction": self.fraction, "ok": self.ok}


def _iperf(netns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, "iperf3", *args]


def ring_flows(rack: Rack, gpus: list[str], seconds: float, base_port: int = 5301) -> Calibration:
    """Each NIC of `gpus` sends to the next one (TCP, iperf3) for `seconds`, all at once.

    The NICs must be at home (no job holds them) and joined by circuits and forwarding; the
    caller arranges that (e.g. all under one aggregator switch)."""
    ip = {g: rack.addresses[g][0] for g in gpus}
    n = len(gpus)
    servers = [
        subprocess.Popen(
            _iperf(netns_of(rack.server_of[g]), "-s", "-1", "-B", ip[g], "-p", str(base_port + i)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, g in enumerate(gpus)
    ]
    try:
        time.sleep(0.3)  # let the servers listen
        cpu, ovs0, t0 = CpuMeter(), _ovs_cpu_seconds(), time.monotonic()
        clients = [
            subprocess.Popen(
                _iperf(
                    netns_of(rack.server_of[g]),
                    "-c",
                    ip[gpus[(i + 1) % n]],
                    "-B",
                    ip[g],
                    "-p",
                    str(base_port + (i + 1) % n),
                    "-t",
                    f"{seconds:g}",
                    "-O",
                    "1",
                    "-J",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, g in enumerate(gpus)
        ]
        outputs = [c.communicate(timeout=seconds + 30) for c in clients]
        cpu.stop()
        ovs1, elapsed = _ovs_cpu_seconds(), time.monotonic() - t0
    finally:
        for s in servers:
            try:
                s.wait(5)
            except subprocess.TimeoutExpired:
                s.kill()
                s.wait()
    flows = []
    for (out, err), g in zip(outputs, gpus, strict=True):
        try:
            flows.append(json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6)
        except (ValueError, KeyError):
            raise RuntimeError(f"calibration: iperf3 from {g} failed: {err.strip() or out[-300:]}") from None
    ovs = None if ovs0 is None or ovs1 is None else 100.0 * (ovs1 - ovs0) / elapsed
    rate = min(rack.spec.emulation.mbps(rack.gpus[g].nic.rate_gbps) for g in gpus)
    return Calibration(rate, [round(f, 2) for f in flows], seconds, cpu.idle, cpu.steal, ovs, list(gpus))


def one_switch_circuits(rack: Rack, gpus: list[str]) -> list[list[str]]:
    """Circuits that put `gpus` under the first aggregator switch with enough downlinks on their OCS."""
    for switch in rack.aggregators():
        free = list(rack.downlink_ports(switch))
        pairs = []
        for g in gpus:
            port = rack.gpu_port(g)
            pick = next(
                (
                    d
                    for d in free
                    if d.device == port.device and rack.endpoints[d].rate_gbps == rack.gpus[g].nic.rate_gbps
                ),
                None,
            )
            if pick is None:
                break
            free.remove(pick)
            pairs.append([str(port), str(pick)])
        if len(pairs) == len(gpus):
            return pairs
    raise ValueError(f"no aggregator switch can take {', '.join(gpus)} at once")


def calibrate(tb, gpus: list[str] | None = None, seconds: float = 4.0) -> Calibration:
    """Run the ring on a running testbed (emulation.harness.Testbed), then put its circuits back."""
    rack = tb.rack
    gpus = gpus or _largest_ring(rack)
    before = tb.client.get("/ocs/circuits")["circuits"]
    tb.client.put("/ocs/circuits", {"circuits": one_switch_circuits(rack, gpus)})
    try:
        return ring_flows(rack, gpus, seconds)
    finally:
        tb.client.put("/ocs/circuits", {"circuits": before})


def _largest_ring(rack: Rack, most: int = 4) -> list[str]:
    """Up to `most` GPUs of one OCS and one line rate, one per server first: two NICs of one server
    would talk inside its namespace, past the emulated fabric."""
    groups: dict[tuple, list[str]] = {}
    for g, spec in rack.gpus.items():
        groups.setdefault((spec.nic.ocs_port.device, spec.nic.rate_gbps), []).append(g)
    best: list[str] = []
    for members in groups.values():
        ring, servers = [], set()
        for g in members:
            if rack.server_of[g] not in servers:
                ring.append(g)
                servers.add(rack.server_of[g])
        best = max(best, ring[:most], key=len)
    if len(best) < 2:
        raise ValueError(f"rack {rack.name}: no two GPUs on different servers share an OCS and a line rate")
    return best


def summary(calibrations: list[Calibration]) -> dict:
    """Median figures over several calibrations (before and after an experiment, say)."""
    return {
        "fraction_median": statistics.median(c.fraction for c in calibrations),
        "fraction_min": min(c.fraction for c in calibrations),
        "steal_percent_max": max(c.steal_percent for c in calibrations),
        "idle_percent_min": min(c.idle_percent for c in calibrations),
        "runs": [c.to_json() for c in calibrations],
    }


@dataclass
class RateCheck:
    """One path's throughput with its shapers in place and, in the same run, without them."""

    rate_mbps: float
    shaped_mbps: float
    unshaped_mbps: float

    @property
    def host_can_tell(self) -> bool:
        """Does this host carry clearly more than the rate without shapers? Only then can a shaper
        that does not limit be told from one that does."""
        return self.unshaped_mbps >= 1.5 * self.rate_mbps

    def problems(self, low: float = 0.8, high: float = 1.05) -> list[str]:
        """What is wrong with the shaped figure; empty if it is what a working shaper gives. A slow
        host lowers the bar (the shaped flow need only reach what the unshaped one did), it never
        fails the check; a shaper that lets more than the rate through fails it wherever the host
        can carry more."""
        out = []
        if self.shaped_mbps > high * self.rate_mbps:
            out.append(f"shaped {self.shaped_mbps:.1f} Mbit/s is above the rate {self.rate_mbps:g} Mbit/s")
        floor = low * min(self.rate_mbps, self.unshaped_mbps)
        if self.shaped_mbps < floor:
            out.append(
                f"shaped {self.shaped_mbps:.1f} Mbit/s is below {floor:.1f} Mbit/s ({low:g} x the lesser of the rate "
                f"and the {self.unshaped_mbps:.1f} Mbit/s this host carried unshaped)"
            )
        return out


def without_shapers(devices: list[tuple[str, str | None]]):
    """A context manager that takes the htb root qdisc off (interface, netns) pairs and puts back
    exactly what was there (re-created with `emulation.shaping.htb_commands` from the saved rate)."""
    import contextlib

    from emulation.ovs import shaped_mbps
    from emulation.shaping import DEV, htb_commands

    @contextlib.contextmanager
    def manage():
        saved = []
        for dev, netns in devices:
            rate = shaped_mbps(dev, netns)
            mtu = _mtu(dev, netns)
            saved.append((dev, netns, rate, mtu, _queue_frames(dev, netns, mtu), _fair_flows(dev, netns),
                          _bucket(dev, netns)))
            subprocess.run(
                ["tc", *(["-n", netns] if netns else []), "qdisc", "del", "dev", dev, "root"],
                capture_output=True,
                check=False,
            )
        try:
            yield
        finally:
            for dev, netns, rate, mtu, frames, flows, bucket in saved:
                if rate is None:
                    continue
                for args in htb_commands(rate, mtu, frames, flows, bucket):
                    subprocess.run(
                        ["tc", *(["-n", netns] if netns else []), *[dev if a == DEV else a for a in args]],
                        capture_output=True,
                        check=True,
                    )

    return manage()


def _fair_flows(dev: str, netns: str | None) -> list[str] | None:
    """The destination addresses of a fair port's leaves, in leaf order (None: the port is one FIFO)."""
    import ipaddress

    from emulation.shaping import FAIR_FIRST

    out = subprocess.run(
        ["tc", *(["-n", netns] if netns else []), "filter", "show", "dev", dev], capture_output=True, text=True
    ).stdout
    leaves, minor = {}, None
    for line in out.splitlines():
        if "flowid 5:" in line:
            minor = int(line.split("flowid 5:")[1].split()[0], 16)
        elif line.strip().startswith("match") and line.strip().endswith("at 16") and minor is not None:
            if minor >= FAIR_FIRST:
                leaves[minor] = str(ipaddress.IPv4Address(int(line.split()[1].split("/")[0], 16)))
            minor = None
    return [leaves[m] for m in sorted(leaves)] or None


def parse_bucket(text: str) -> int | None:
    """The burst of htb's root class 5:1 in `tc class show`'s text, in bytes (tc prints it as b, Kb or Mb, to a few
    bytes of what was set); None where there is none."""
    m = re.search(r"^class htb 5:1 root .*?\bburst (\d+(?:\.\d+)?)(b|Kb|Mb)\b", text, re.M)
    if m is None:
        return None
    return round(float(m.group(1)) * {"b": 1, "Kb": 1024, "Mb": 1024 * 1024}[m.group(2)])


def _bucket(dev: str, netns: str | None) -> int | None:
    """The htb bucket an interface's shaper has (emulation/shaping.py: an uplink's is smaller than a NIC's)."""
    out = subprocess.run(
        ["tc", *(["-n", netns] if netns else []), "class", "show", "dev", dev], capture_output=True, text=True
    ).stdout
    return parse_bucket(out)


def _queue_frames(dev: str, netns: str | None, mtu: int) -> int:
    """Frames the bulk class's queue (bfifo 20:, or a fair port's default leaf 99:) holds on an interface (the
    fabric's queue size)."""
    from emulation.shaping import QUEUE_FRAMES

    out = subprocess.run(
        ["tc", *(["-n", netns] if netns else []), "-j", "qdisc", "show", "dev", dev], capture_output=True, text=True
    ).stdout
    for q in json.loads(out) if out.strip() else []:
        if q.get("kind") == "bfifo" and q.get("handle") in ("20:", "99:"):
            return int(q["options"]["limit"]) // (mtu + 14)
    return QUEUE_FRAMES


def _mtu(dev: str, netns: str | None) -> int:
    out = subprocess.run(
        ["ip", *(["-n", netns] if netns else []), "-j", "link", "show", "dev", dev], capture_output=True, text=True
    ).stdout
    return int(json.loads(out)[0]["mtu"]) if out.strip() else 1500

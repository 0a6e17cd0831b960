"""Line-rate shaping of emulated links with htb, with TCP acknowledgements ahead of bulk data.

Each shaped interface gets an htb root at the line rate and two children that may each borrow
all of it: one for small TCP segments (pure acknowledgements, IP length under 128 bytes) at
priority 0, one for everything else. Without this, every NIC's queue holds its outgoing data and
the acknowledgements of the data it receives, and in a ring all-reduce (every NIC sends and
receives at once) the delayed acknowledgements held each flow to about 81 % of the line rate;
with it, about 91 % (scripts/bench_allreduce.py). A real NIC's queue is microseconds deep at
100 Gbit/s; our scaled queue is not, and this keeps it from stalling the reverse direction.
Only htb, tbf, pfifo and the u32 filter exist in the kernels we target (no fq, no netem).
Only a segment with no payload whose TCP flags are ACK alone (the flags at byte 33 with no IP options; ECN's
two bits ignored) goes ahead: anything that takes sequence space (a small data segment, a FIN, a SYN) or ends the
connection (RST) stays in the bulk class, behind its flow's earlier segments. Ahead of them it arrives
out of order, and TCP takes the reordering for a loss: a FIN that overtook the last segments queued at an
uplink made the receiver acknowledge it selectively, and the sender retransmitted every segment it
skipped (seen on the lossless fabric's deeper queues as one recovery of 5-16 segments at a job's end).
"""
from __future__ import annotations

from controller.core.emulated import WINDOW_SEGMENTS

DEV = "{dev}"
# Each class queues at most this many full frames, like a switch port's shallow buffer. Open
# vSwitch's userspace datapath sends every packet through ONE packet socket, whose send buffer
# holds the packets of every port's queue until they leave: a congested port with a deep queue
# (htb's default is 1,000 frames) would fill it, and then every other port's packets are dropped
# (ovs-vswitchd.log: "error sending Ethernet packet ... Resource temporarily unavailable").
QUEUE_FRAMES = 8  # the droptail fabric's queues (emulation.fabric: droptail)

# The lossless fabric's queues: see WINDOW_SEGMENTS in controller.core.emulated.
FLOWS_PER_GPU = 4  # a rank's ring connections (to the next and the previous rank) and a spare pair
MIN_LOSSLESS_FRAMES = 32


def lossless_queue_frames(gpus: int) -> int:
    """Frames each queue of a lossless rack with `gpus` GPU NICs holds: every window that can meet there."""
    return max(MIN_LOSSLESS_FRAMES, gpus * FLOWS_PER_GPU * (WINDOW_SEGMENTS + 1))


def queue_frames(fabric: str, gpus: int) -> int:
    """Frames per shaped queue on the `fabric` ("lossless" or "droptail") of a rack with `gpus` GPU NICs."""
    if fabric == "lossless":
        return lossless_queue_frames(gpus)
    if fabric == "droptail":
        return QUEUE_FRAMES
    raise ValueError(f"unknown fabric {fabric!r} (lossless or droptail)")



# u32 matches of a pure acknowledgement, one list per TCP header length (data offset 5-15 words): IPv4 with no
# options, TCP, an IP total length of exactly the two headers (no payload), TCP flags (URG ACK PSH RST SYN FIN) =
# ACK. Matching the length exactly, not "short", keeps a small data segment (a tail without PSH) behind its flow.
ACK_ONLY = [["match", "u8", "0x45", "0xff", "at", "0", "match", "ip", "protocol", "6", "0xff",
             "match", "u16", f"0x{20 + 4 * words:04x}", "0xffff", "at", "2",
             "match", "u8", f"0x{words << 4:02x}", "0xf0", "at", "32", "match", "u8", "0x10", "0x3f", "at", "33"]
            for words in range(5, 16)]
FAIR_DEFAULT = 0x99  # the fair bulk class's leaf for what no address filter takes (ARP, addresses not listed)
FAIR_FIRST = 0x100  # the fair bulk class's leaf of the i-th address: 5:(0x100 + i)


# An uplink's htb bucket: the time at its rate it holds (`bucket_bytes`). htb sends while its bucket is not empty, so
# after an idle time it passes the bucket and one frame more at once, at the rate of the port before it. Two frames
# there (18 kB) let each ring step's first 27 kB cross a 6.5 Mbit/s uplink at the NIC's 50 Mbit/s, which a real port
# cannot: a 2-GPU ResNet-50 ring across as1-as2 ran 10 % faster than its bytes at the uplink's rate allow
# (docs/neighbour-panama.md). A millisecond keeps the rate when the qdisc's timer fires late (tokens beyond the bucket
# are lost) and lets through one frame and ~0.8 kB more. The NICs keep two frames: their bucket is in the ring step's
# measured cost (STEP_S, simulator/model/calibration.py, measured under one switch), which a change here would move.
UPLINK_BUCKET_S = 1e-3


def bucket_bytes(mbps: float, seconds: float = UPLINK_BUCKET_S) -> int:
    """An htb bucket of `seconds` at `mbps` Mbit/s, in bytes, at least one."""
    return max(1, int(mbps * 1e6 / 8 * seconds))


def htb_commands(mbps: float, mtu: int = 1500, frames: int = QUEUE_FRAMES,
                 flows: list[str] | None = None, bucket: int | None = None) -> list[list[str]]:
    """tc argument lists (after `tc`), with ``{dev}`` where the interface goes.

    The quantum is one full frame, so a jumbo frame is sent in one round. The bucket (burst and cburst of every
    class) is `bucket` bytes where given (an uplink's: `bucket_bytes`), else two frames (at least 15 kB, a NIC's):
    a burst is what a sender gets above the rate after an idle compute phase, so a bigger one would let each
    all-reduce step beat the line rate.

    `flows` (destination addresses): the bulk class is split into one leaf per address, each queue its own and
    each guaranteed an equal part, lending what it leaves idle to the others one frame per round (htb's deficit
    round robin among leaves of one priority): flows that meet here share the port max-min fairly, whatever their
    round-trip times, as RoCE's congestion control shares a congested port. The lossless fabric's uplinks, where
    rings' flows meet, get it (emulation/topo.py)."""
    rate, acks, bulk = f"{mbps:g}Mbit", f"{mbps / 10:g}Mbit", f"{mbps * 0.9:g}Mbit"
    frame = mtu + 14
    burst = str(bucket if bucket is not None else max(15_000, 2 * frame))
    common = ["burst", burst, "cburst", burst, "quantum", str(frame)]
    queue = ["bfifo", "limit", str(frames * frame)]
    leaves = [(FAIR_DEFAULT, None)] + [(FAIR_FIRST + i, addr) for i, addr in enumerate(flows)] if flows else []
    default = f"{FAIR_DEFAULT:x}" if leaves else "20"  # the leaf of what no filter takes
    cmds = [
        ["qdisc", "replace", "dev", DEV, "root", "handle", "5:", "htb", "default", default],
        ["class", "replace", "dev", DEV, "parent", "5:", "classid", "5:1", "htb", "rate", rate, *common],
        ["class", "replace", "dev", DEV, "parent", "5:1", "classid", "5:10", "htb", "rate", acks, "ceil", rate,
         "prio", "0", *common],
        ["class", "replace", "dev", DEV, "parent", "5:1", "classid", "5:20", "htb", "rate", bulk, "ceil", rate,
         "prio", "1", *common],
        ["qdisc", "replace", "dev", DEV, "parent", "5:10", "handle", "10:", *queue],
        *(["filter", "add", "dev", DEV, "parent", "5:", "protocol", "ip", "prio", "1", "u32", *match, "flowid", "5:10"]
          for match in ACK_ONLY),
    ]
    if not leaves:  # one FIFO for the bulk class
        return [*cmds, ["qdisc", "replace", "dev", DEV, "parent", "5:20", "handle", "20:", *queue]]
    share = f"{mbps * 0.9 / len(leaves):g}Mbit"  # every leaf's guaranteed part: the bulk rate split evenly
    for minor, addr in leaves:
        cmds += [
            ["class", "replace", "dev", DEV, "parent", "5:20", "classid", f"5:{minor:x}", "htb", "rate", share,
             "ceil", rate, "prio", "1", *common],
            ["qdisc", "replace", "dev", DEV, "parent", f"5:{minor:x}", "handle", f"{minor:x}:", *queue],
        ]
        if addr is not None:
            cmds.append(["filter", "add", "dev", DEV, "parent", "5:", "protocol", "ip", "prio", "2", "u32",
                         "match", "ip", "dst", f"{addr}/32", "flowid", f"5:{minor:x}"])
    return cmds

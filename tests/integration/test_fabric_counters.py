"""The drop collector fails closed on the real rack: a drop injected on an emulated port (a GPU NIC overflowing a tiny
token bucket) is read as a drop,
an interface the snapshot cannot read is an error (never zero drops), and the demo's fabric check sees both."""
from __future__ import annotations

import subprocess
import sys

from controller.core.emulated import netns_of, nic_plans
from emulation import counters
from emulation import rack as rackmod
from evidence.demo.checks import fabric_checks
from tests.integration.helpers import sh

BURST = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, sys.argv[1].encode())
refused = 0
for _ in range(30):
    try:
        s.sendto(bytes(1000), (sys.argv[2], 9))  # the discard port; nothing needs to answer
    except OSError:
        refused += 1  # the queue's drop, told to the sender (ENOBUFS)
print(f"sent 30, refused {refused}")
"""


def test_a_drop_on_an_emulated_port_and_a_failed_read_reach_the_demos_fabric_check(bed):
    state = rackmod.RackState.load()
    namespaces = sorted(state.namespaces.values())
    src, dst = nic_plans(bed.rack)[0], nic_plans(bed.rack)[1]
    where = netns_of(src.server)
    before = counters.snapshot(state.root_intfs, namespaces)
    assert f"root {state.root_intfs[0]} rx" in before  # every interface read, idle or not
    assert "noqueue" in sh("ip", "netns", "exec", where, "tc", "qdisc", "show", "dev", src.ifname)
    # the first GPU's NIC sends through a token bucket of 1 kB/s and a queue of 1,600 bytes (htb, tbf, pfifo and u32
    # are what the kernels we target have: emulation/shaping.py): 30 datagrams of 1 kB sent at once overflow it
    # (not ping: it backs off when the queue refuses a packet, which made this a 30-s test)
    # a permanent neighbour entry for the target, so the pings leave without waiting for an ARP reply (the idle
    # rack's NICs have no route installed between them)
    sh("ip", "netns", "exec", where, "ip", "neigh", "replace", dst.ip, "lladdr", dst.mac, "dev", src.ifname,
       "nud", "permanent")
    sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", src.ifname, "root", "handle", "77:", "tbf",
       "rate", "8kbit", "burst", "1600", "limit", "1600")
    try:
        pinged = subprocess.run(["ip", "netns", "exec", where, sys.executable, "-c", BURST, src.ifname, dst.ip],
                                capture_output=True, text=True, timeout=30)
        after = counters.snapshot(state.root_intfs, namespaces)
        seen = sh("ip", "netns", "exec", where, "tc", "-s", "qdisc", "show", "dev", src.ifname)
    finally:
        sh("ip", "netns", "exec", where, "tc", "qdisc", "del", "dev", src.ifname, "root")
        sh("ip", "netns", "exec", where, "ip", "neigh", "del", dst.ip, "dev", src.ifname, check=False)
    dropped = counters.fabric_record(before, after, [])
    at_nic = {k: n for k, n in dropped["drops"].items() if k.startswith(f"{where} {src.ifname} qdisc") and n}
    assert at_nic and sum(at_nic.values()) >= 3, (pinged.stdout[-600:], pinged.stderr[-300:], seen,
                                                  {k: n for k, n in dropped["drops"].items() if n})
    assert len(dropped["drops"]) > len(at_nic)  # the counters that did not grow are kept, as zero
    # an interface the rack should have and the snapshot cannot find: an error, not an empty reading
    unread = counters.fabric_record(before, counters.read([*state.root_intfs, "as9-p99"], namespaces), [])
    assert unread["drops"] == {} and "root as9-p99 rx" in unread["errors"][0]
    record = {"fabric": bed.rack.spec.emulation.fabric, "calibration": {"runs": []},
              "runs": [{"tag": "injected drop", "fabric_counters": dropped},
                       {"tag": "failed read", "fabric_counters": unread}]}
    got = fabric_checks(record)
    assert not got["fabric_clean"]
    assert set(got["fabric_drops"]) == set(at_nic)
    assert got["fabric_read_errors"] == [f"failed read: {unread['errors'][0]}"]

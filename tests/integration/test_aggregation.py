"""In-network aggregation on the emulated paper rack: a 4-rank job regrouped under as1 sums its gradients at as1's
aggregator (the rack runs it on as1's port 20), with drops on that port, and gets the ring's exact sums."""
from __future__ import annotations

import json
import subprocess
import sys

from controller.core import aggregators
from controller.core.emulated import netns_of, port_intf
from emulation import rack as rackmod
from tests.integration.helpers import ROOT, sh

UNDER_AS1 = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:13"], ["ocs1:4", "ocs1:14"],
             ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]]
GRADIENT = 400_000  # bytes: 45 chunks of 2,236 elements (a 9000-byte frame each) through a pool of 7 (63 kB)
ITERATIONS = 3


def tx_bytes(intf: str) -> int:
    return int(sh("cat", f"/sys/class/net/{intf}/statistics/tx_bytes"))


def test_four_ranks_under_as1_sum_at_its_aggregator_through_drops(bed, tmp_path):
    rack = bed.rack
    agg = next(a for a in aggregators.aggregators(rack) if a.switch == "as1")
    state = rackmod.RackState.load()
    assert state.aggregators["as1"]["address"] == agg.address  # the rack runs it, on as1's port
    bed.client.put("/ocs/circuits", {"circuits": UNDER_AS1})  # returns once the circuits and tables are set
    gpus = ["gpu1", "gpu2", "gpu3", "gpu4"]
    master = rack.addresses["gpu1"][0]
    port = port_intf("as1", agg.port)
    # drops on the aggregator's port: a queue of 20 kB toward the aggregator, which the ranks' bursts overflow
    sh("tc", "qdisc", "add", "dev", port, "root", "tbf", "rate", "400mbit", "burst", "20000", "limit", "20000")
    procs = []
    try:
        before = tx_bytes(port)
        for rank, gpu in enumerate(gpus):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", netns_of(rack.server_of[gpu]), sys.executable, "-m", "containers.worker",
                 "--rank", str(rank), "--world-size", "4", "--master", master, "--master-port", "29611",
                 "--ifname", rack.interface(gpu), "--iterations", str(ITERATIONS), "--compute-seconds", "0",
                 "--gradient-bytes", str(GRADIENT), "--collective", "aggregate", "--aggregator", agg.address,
                 "--aggregation-rto", "0.02",  # the pool's shape by default: from the NIC's MTU
                 "--timeout", "60", "--control-dir", str(tmp_path / f"control-{rank}")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
            outs.append([json.loads(line) for line in out.splitlines() if '"alive"' not in line])
        into = tx_bytes(port) - before
        drops = sh("tc", "-s", "qdisc", "show", "dev", port)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        sh("tc", "qdisc", "del", "dev", port, "root", check=False)
    for records in outs:
        start = next(r for r in records if r["event"] == "start")
        assert start["collective"] == "aggregate" and start["aggregator"] == agg.address
        assert start["aggregation_pool_bytes"] == 7 * 2236 * 4
        assert records[-1]["event"] == "done" and records[-1]["check"] == "ok"  # every iteration's sum exact
    # every rank's gradient reached the aggregator once per iteration (headers and chunks sent again on top)
    assert into >= 4 * GRADIENT * ITERATIONS
    dropped = int(drops.split("dropped ")[1].split(",")[0])
    resent = sum(next(r for r in records if r["event"] == "aggregated")["resent"] for records in outs)
    assert dropped > 0 and resent > 0, (drops, resent)

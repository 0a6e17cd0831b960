"""In-network aggregation on the emulated paper rack: a 4-rank job regrouped under as1 sums its gradients at as1's
aggregator (the rack runs it on as1's port 20), with drops on that port, and gets the ring's exact sums; and the
controller's jobs that ask for aggregation: placed under a switch whose aggregator has room, or run as a ring with
the reason, the aggregator told when the job ends."""
from __future__ import annotations

import json
import subprocess
import sys

import yaml

from controller.core import aggregators
from controller.core.emulated import RUN_DIR, netns_of, port_intf
from emulation import rack as rackmod
from tests.integration.helpers import PAPER, ROOT, sh, wait_for
from tests.integration.test_jobs import device_switch_of

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


def _lines(client, job_id: str) -> dict[str, list[dict]]:
    """Each worker's JSON lines, as the controller kept them at the job's end."""
    logs = client.get(f"/jobs/{job_id}/logs")["logs"]
    return {g: [json.loads(x) for x in lines if x.startswith("{")] for g, lines in logs.items()}


def test_the_controller_places_an_aggregating_job_under_an_aggregator_and_the_next_as_a_ring(bed, tmp_path):
    """A rack file where as1's aggregator takes one job and as2's no pool at all: a 4-GPU job asking for aggregation,
    its GPUs under both switches at the start, is regrouped under as1 and sums there exactly; a second one, with as1's
    aggregator full, runs as a ring and says why."""
    data = yaml.safe_load(PAPER.read_text())
    data["switches"][0]["aggregator"]["jobs"] = 1
    data["switches"][1]["aggregator"]["capacity_bytes"] = 1000
    rack_file = tmp_path / "paper-one-aggregation.yaml"
    rack_file.write_text(yaml.safe_dump(data))
    as1 = next(a for a in aggregators.aggregators(bed.rack) if a.switch == "as1")
    work = {"iterations": 3, "compute_seconds": 0}
    default, bed.rack_file = bed.rack_file, rack_file
    try:
        client = bed.restart()
        first = client.post("/jobs", {"gpus": ["gpu1", "gpu2", "gpu3", "gpu4"], "collective": "aggregate",
                                      "workload": work})["job"]
        second = client.post("/jobs", {"gpus": 2, "collective": "aggregate", "workload": work})["job"]
        assert first["aggregation"]["collective"] == "aggregate" and first["aggregation"]["switch"] == "as1"
        assert first["aggregation"]["address"] == as1.address
        assert second["aggregation"] == {"collective": "ring", "reason": "no aggregator has room: as1's holds 1 "
                                         f"job(s), its most; as2's has 1000 of 1000 bytes free, {7 * 2236 * 4} needed"}
        wait_for(lambda: all(client.get(f"/jobs/{j['id']}")["job"]["state"] in ("done", "failed", "stopped")
                             for j in (first, second)), 240, "both jobs to end")
        ran = {j["id"]: client.get(f"/jobs/{j['id']}")["job"] for j in (first, second)}
        assert [ran[j["id"]]["state"] for j in (first, second)] == ["done", "done"], ran
        assert ran[first["id"]]["switches"] == ["as1"]  # regrouped under its aggregator's switch
        assert {device_switch_of(g) for g in ran[first["id"]]["gpus"]} == {"as1"}  # on the OCS bridge itself
        for gpu, records in _lines(client, first["id"]).items():
            start = next(r for r in records if r["event"] == "start")
            assert start["collective"] == "aggregate" and start["aggregator"] == as1.address, (gpu, start)
            assert start["aggregation_job"] == first["aggregation"]["key"]
            assert start["aggregation_pool_bytes"] == first["aggregation"]["bytes"]  # what was reserved
            assert next(r for r in records if r["event"] == "aggregated")["received"] > 0, gpu
            assert records[-1]["event"] == "done" and records[-1]["check"] == "ok", gpu  # every sum exact
        for gpu, records in _lines(client, second["id"]).items():
            start = next(r for r in records if r["event"] == "start")
            assert start["collective"] == "ring" and records[-1]["check"] == "ok", (gpu, start)
        # at its end the controller told as1's aggregator (a packet-out of its port): the aggregator's own log says
        # so (nothing left to free: the workers of a job that is done have left)
        ended = {"event": "ended", "job": first["aggregation"]["key"], "freed_bytes": 0}
        log = RUN_DIR / "aggregator-as1.log"
        wait_for(lambda: ended in [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")], 10,
                 "as1's aggregator to log the first job's end")
    finally:
        bed.rack_file = default
        bed.restart()

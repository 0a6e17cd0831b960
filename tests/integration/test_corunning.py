"""A job that runs beside a regroup does not notice it: its circuits and flows on the devices are
byte-identical before and after (ovs-ofctl dumps, counters removed), and it runs on to the end
with every iteration's all-reduce checked."""
from __future__ import annotations

import re

from controller.core.rack import load_rack
from tests.integration.helpers import PAPER, assert_no_containers, ofctl, sh, wait_for

RACK = load_rack(PAPER)
FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]
RED, BLUE = ["gpu1", "gpu2", "gpu3", "gpu4"], ["gpu5", "gpu6"]
COUNTERS = re.compile(r"\b(duration|n_packets|n_bytes|idle_age|hard_age)=[^,\s]+,?\s*")
ACTIVE = "pending,configuring,running"
BLUE_ITERATIONS = 14  # VGG-16's gradients across the uplink, about 1 s each: blue outlasts red's start and regroup




def blue_dump(circuits: list[list[str]]) -> list[str]:
    """Every flow on the devices that carries BLUE's traffic, without counters."""
    ports = {int(p.split(":")[1]) for c in circuits for p in c if any(p == str(RACK.gpu_port(g)) for g in BLUE)}
    ports |= {int(q.split(":")[1]) for c in circuits if {int(p.split(":")[1]) for p in c} & ports for q in c}
    ips = {RACK.addresses[g][0] for g in BLUE}
    lines = []
    for line in ofctl("dump-flows", "ocs1").splitlines():
        m = re.search(r"in_port=(\d+)", line)
        if m and int(m.group(1)) in ports:
            lines.append("ocs1 " + COUNTERS.sub("", line).strip())
    for switch in ("as1", "as2"):
        for line in ofctl("dump-flows", switch).splitlines():
            if any(re.search(rf"(nw_dst|arp_tpa)={re.escape(ip)}\b", line) for ip in ips):
                lines.append(f"{switch} " + COUNTERS.sub("", line).strip())
    return sorted(lines)


def retransmits(gpu: str) -> int | None:
    """TCP segments retransmitted in a worker's network namespace (shown, not asserted: shaping may drop)."""
    try:
        snmp = sh("ip", "netns", "exec", f"optirack-c-{gpu}", "cat", "/proc/net/snmp").splitlines()
    except AssertionError:
        return None
    head, values = [line.split() for line in snmp if line.startswith("Tcp:")][:2]
    return int(values[head.index("RetransSegs")])


def test_a_regroup_leaves_the_job_beside_it_untouched(bed):
    client = bed.client
    wait_for(lambda: not client.get("/jobs", state=ACTIVE)["jobs"], 120, "earlier jobs to end")
    client.put("/ocs/circuits", {"circuits": FRAGMENTED})
    blue = client.post("/jobs", {"gpus": BLUE, "policy": "fixed",
                                 "workload": {"iterations": BLUE_ITERATIONS, "compute_seconds": 0.02}})["job"]
    red = client.post(
        "/jobs",
        {
            "gpus": RED,
            "policy": "fixed",
            "workload": {"model": "resnet50", "iterations": 100000, "compute_seconds": 0.05},
        },
    )["job"]
    wait_for(lambda: client.get(f"/jobs/{blue['id']}")["job"]["iterations_done"] >= 4, 180, "blue to iterate")
    wait_for(lambda: client.get(f"/jobs/{red['id']}")["job"]["state"] == "running", 120, "red to run")
    circuits = client.get("/ocs/circuits")["circuits"]
    blue_circuits = [c for c in circuits if c in FRAGMENTED and {"ocs1:5", "ocs1:6"} & set(c)]
    before, retrans_before = blue_dump(circuits), {g: retransmits(g) for g in BLUE}
    assert len([x for x in before if x.startswith("ocs1")]) == 4 and len(before) > 4  # 2 circuits, both ways; tables

    ev = client.post(f"/jobs/{red['id']}/regroup")["event"]
    assert ev["status"] == "ok" and ev["removed"], ev
    after_circuits = client.get("/ocs/circuits")["circuits"]
    assert all(c in after_circuits for c in blue_circuits)
    assert blue_dump(after_circuits) == before, "the regroup changed a flow that carries the other job"
    progress = client.get(f"/jobs/{blue['id']}")["job"]["iterations_done"]
    retrans_after = {g: retransmits(g) for g in BLUE}

    wait_for(lambda: client.get(f"/jobs/{blue['id']}")["job"]["state"] != "running", 300, "blue to end")
    done = client.get(f"/jobs/{blue['id']}")["job"]
    assert done["state"] == "done", done["reason"]
    assert done["iterations_done"] == BLUE_ITERATIONS and progress < BLUE_ITERATIONS, (
        "blue must have run on across the regroup"
    )
    log = done["iteration_log"]
    across = [i for i in log if i["t_start"] <= ev["dark_end"] and i["t_end"] >= ev["dark_start"]]
    others = sorted(i["iter_s"] for i in log)
    print(
        f"blue: {len(across)} iteration(s) overlapped red's dark window, taking "
        f"{[round(i['iter_s'], 3) for i in across]} s (median of all {others[len(others) // 2]:.3f} s); "
        f"TCP retransmits before the regroup {retrans_before}, just after it {retrans_after}"
    )
    client.delete(f"/jobs/{red['id']}")
    wait_for(lambda: not client.get("/jobs", state=ACTIVE)["jobs"], 120, "red to stop")
    assert_no_containers()

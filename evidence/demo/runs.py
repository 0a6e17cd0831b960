"""The paper experiment's runs on a testbed (evidence/demo/experiment.py builds the testbeds, calibrates them and
writes the record; this runs the jobs on one): a fragmented/regrouped pair repeated, the order alternating
(`run_pairs`), one case with both its jobs at once from the fragmented cabling (`run_case`, `one_case`, `wait_job`),
what the job beside did meanwhile (`beside_summary`) and when a ring was in its all-reduce (`all_reduces`). Around each
run and each calibration the fabric's drop and retransmission counters and the uplinks' shares are read
(`fabric_counted`, `calibrate_counted`). `log` prints the experiment's timestamped progress lines.
"""
from __future__ import annotations

import statistics
import time

from emulation import counters
from emulation import shares as sharecheck
from emulation.calibrate import Calibration, CpuMeter, calibrate
from emulation.harness import Testbed
from evidence.demo.settings import Settings
from simulator.inputs.cases import Case

# The rack file's starting cabling: srv1 and srv2 under as1, srv3 and srv4 under as2.
FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]

TCP = counters.TcpSampler()  # each container namespace's TCP counters, polled while the experiment runs


def fabric_counted(tb: Testbed, rings: list[list[str]], what, *args):
    """Run `what(*args)` and read, around it, every drop counter of the fabric, the TCP counters of
    the container namespaces that lived meanwhile, and (`rings` given: the GPUs of each job) the
    crossing flows' shares of the uplinks; returns (result, their record)."""
    rack = tb.rack
    uplinks = {w.name: {u.port for u in w.uplinks} for w in rack.spec.switches if w.uplinks}
    capacity = min(rack.spec.emulation.mbps(u.rate_gbps) for w in rack.spec.switches for u in w.uplinks) * 1e6
    namespaces = sorted(tb.state.namespaces.values())
    before = counters.read(tb.state.root_intfs, namespaces)  # a failed read is kept as its error
    TCP.take()  # forget namespaces of earlier runs
    with sharecheck.UplinkSampler(uplinks) as sampler:
        result = what(*args)
    spans = result.pop("_all_reduces", None) if isinstance(result, dict) else None
    dark = result.pop("_dark", []) if isinstance(result, dict) else []
    after = counters.read(tb.state.root_intfs, namespaces)
    fabric = {"fabric": rack.spec.emulation.fabric, **counters.fabric_record(before, after, TCP.take(), dark),
              "ocs_dark_windows": dark}
    for error in fabric["errors"]:
        log(f"    COUNTERS NOT READ: {error}")
    if rings:
        ips = [{rack.addresses[g][0] for g in ring} for ring in rings]
        fabric["uplink_shares"] = sharecheck.uplink_shares(sampler.samples, capacity, ips, spans)
        fabric["share_problems"] = sharecheck.share_problems(fabric["uplink_shares"])
        for problem in fabric["share_problems"]:
            log(f"    SHARE: {problem}")
    return result, fabric


def calibrate_counted(tb: Testbed) -> tuple[Calibration, dict]:
    cal, fabric = fabric_counted(tb, [], calibrate, tb)
    out = {**cal.to_json(), "fabric_counters": fabric}
    for problem in fabric["problems"]:
        log(f"  FABRIC: calibration: {problem}")
    return cal, out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_pairs(
    tb: Testbed, case: Case, s: Settings, iterations: int, label: str, record: dict, detail: bool
) -> list[tuple[dict, dict]]:
    pairs = []
    for rep in range(s.repeats):
        order = ("fixed", "regroup") if rep % 2 == 0 else ("regroup", "fixed")  # no drift favours one
        runs = {}
        for policy in order:
            tag = f"{label} {'fragmented' if policy == 'fixed' else 'regrouped'} #{rep + 1}"
            runs[policy] = run_case(tb, case, policy, iterations, s.model, tag, detail and rep == 0)
            runs[policy]["repeat"] = rep
            record["runs"].append(runs[policy])
        pairs.append((runs["fixed"]["summary"], runs["regroup"]["summary"]))
        f, g = pairs[-1]
        log(f"  {label} #{rep + 1}: regrouping saved {100 * (1 - g['completion_s'] / f['completion_s']):.1f} %")
    return pairs


def wait_job(tb: Testbed, job_id: str, what: str, total: int, timeout: float) -> dict:
    deadline, last = time.monotonic() + timeout, -1
    while True:
        job = tb.client.get(f"/jobs/{job_id}")["job"]
        done = job["iterations_done"]
        if done != last and (done % 5 == 0 or done == total):
            last = done
            log(f"    {what}: {job_id} {job['state']}, iteration {done}/{total}")
        if job["state"] not in ("pending", "configuring", "running", "recovering"):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job_id} did not finish within {timeout:.0f} s")
        time.sleep(1)


def run_case(tb: Testbed, case: Case, policy: str, iterations: int, model: str, tag: str, detail: bool) -> dict:
    """`one_case`, with the fabric's drop and retransmission counters read around it."""
    rings = [case.concern, case.other]
    cpu = CpuMeter()
    run, fabric = fabric_counted(tb, rings, one_case, tb, case, policy, iterations, model, tag, detail)
    cpu.stop()
    run["summary"]["host_idle_percent"], run["summary"]["host_steal_percent"] = cpu.idle, cpu.steal
    run["fabric_counters"] = fabric
    for problem in fabric["problems"]:
        log(f"    FABRIC: {tag}: {problem}")
    return run


def one_case(tb: Testbed, case: Case, policy: str, iterations: int, model: str, tag: str, detail: bool) -> dict:
    """Both jobs of a case at once from the fragmented start; the job of concern uses `policy`."""
    tb.client.put("/ocs/circuits", {"circuits": FRAGMENTED})
    workload = {"model": model, "iterations": iterations}
    # The paper's jobs save no checkpoint: K as long as the job (no save within it) keeps its traffic the paper's.
    red_req = {"name": f"{tag} red", "gpus": case.concern, "policy": policy, "workload": workload,
               "checkpoint_every": iterations}
    red = tb.client.post("/jobs", red_req)["job"]
    blue = tb.client.post(
        "/jobs",
        {
            "name": f"{tag} blue",
            "gpus": case.other,
            "policy": "fixed",
            "workload": {**workload, "iterations": iterations * 20},
            "checkpoint_every": iterations * 20,
        },
    )["job"]
    blue_job = None
    try:
        done = wait_job(tb, red["id"], tag, iterations, timeout=120 + 60 * iterations)
        blue_job = tb.client.get(f"/jobs/{blue['id']}", history=100_000)["job"]  # its all-reduces, below
    finally:
        blue_stopped = time.time()
        tb.client.delete(f"/jobs/{blue['id']}")  # blue ran beside red for red's whole run
    if done["state"] != "done":
        raise RuntimeError(f"{tag}: {red['id']} {done['state']}: {done['reason']}")
    job = tb.client.get(f"/jobs/{red['id']}", history=100_000)["job"]
    its = job["iteration_log"]
    dilation = tb.rack.spec.emulation.time_dilation
    summary = {
        "policy": policy,
        "switches": job["switches"],
        "completion_s": job["completion_s"],
        "completion_rack_s": job["completion_s"] / dilation,
        "mean_iteration_rack_s": statistics.fmean(i["iter_s"] for i in its) / dilation,
        "mean_compute_rack_s": statistics.fmean(i["compute_s"] for i in its) / dilation,
        "mean_comm_rack_s": statistics.fmean(i["comm_s"] for i in its) / dilation,
        "mean_gpu_util": statistics.fmean(i["gpu_util"] for i in its),
    }
    log(
        f"    {tag}: done in {summary['completion_rack_s']:.2f} rack s on {','.join(job['switches'])}, "
        f"mean iteration {summary['mean_iteration_rack_s']:.3f} rack s, compute fraction {summary['mean_gpu_util']:.2f}"
    )
    run = {"case": case.name, "tag": tag, "summary": summary, "_all_reduces": [all_reduces(job), all_reduces(blue_job)],
           "red_span": (job["started_at"], job.get("ended_at")), "blue_stopped_at": blue_stopped,
           "beside": beside_summary(blue_job, job["started_at"], job.get("ended_at") or blue_stopped, dilation)}
    if policy == "regroup":  # red's circuits changed while it was configuring, with blue beside it
        run["_dark"] = [(job["created_at"], job["started_at"])]
    if detail:
        run["job"] = job
    return run


def beside_summary(blue: dict | None, start: float, end: float, dilation: float) -> dict | None:
    """The job beside's iterations while the job of concern ran (rack seconds): what it asked of the links they
    share, for the simulator's model of it (simulator/model/fidelity.py simulates both)."""
    its = [i for i in (blue or {}).get("iteration_log") or [] if start <= i["t_start"] and i["t_end"] <= end]
    if not its:
        return None
    return {"iterations": len(its), "gpus": (blue or {}).get("gpus"),
            "mean_iteration_rack_s": statistics.fmean(i["iter_s"] for i in its) / dilation,
            "mean_compute_rack_s": statistics.fmean(i["compute_s"] for i in its) / dilation,
            "mean_comm_rack_s": statistics.fmean(i["comm_s"] for i in its) / dilation}


def all_reduces(job: dict | None) -> list[tuple[float, float]]:
    """When a job's ring communicated: the spans (wall-clock seconds) in which every rank was in its
    all-reduce, from the ranks' iteration records."""
    recorded = ((job or {}).get("ranks") or {}).values()
    ranks = [[(r["t_start"] + r["compute_s"], r["t_end"]) for r in recs] for recs in recorded]
    if not ranks:
        return []
    spans = ranks[0]
    for other in ranks[1:]:
        spans = [(max(a, c), min(b, d)) for a, b in spans for c, d in other if max(a, c) < min(b, d)]
    return spans

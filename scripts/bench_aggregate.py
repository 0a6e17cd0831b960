#!/usr/bin/env python3
"""Benchmark: in-network aggregation against ring all-reduce on the emulated paper rack, over a matrix of jobs:
2 and 4 GPUs (--sizes), vgg16 and resnet50 (--models), under one switch and spread (--placements); --matrix is
all eight.

The rack and a controller are brought up once. For each configuration the job's GPUs (the first N of --gpus) are
cabled by the OCS: `one`: all under the switch of the first aggregator (as1 on the paper rack); `spread`: the first
half there and the rest under the next switch, the aggregator on the first one, so half the ranks reach it across
the uplink. Then the same job (the worker's profile of the model: its compute phase and its scaled gradient) runs
--repeats times with the ring and as often aggregating, alternately (ring first in odd pairs, aggregate first in even
ones), one job at a time. Under one switch the job is submitted through the controller's REST API as a user submits
it (`"collective": "ring"` or `"aggregate"`, which the controller places under that switch's aggregator). Spread,
the controller would regroup an aggregating job under one switch, or keep it spread and run it as a ring, so the
ranks are started by the benchmark itself, as processes in their servers on their NICs, with the flags the
controller gives its workers (and `--aggregator` of the first switch's aggregator).

Each run keeps, from the workers' lines: the median over its iterations (the first left out: connections and the
aggregator's join) of the all-reduce time (the slowest rank's) and of the iteration time (likewise), whether every
sum was exact (the worker checks it), the collective each rank's start line says it ran, the gradient's bytes S,
aggregating, each chunk's round trip from its send to its sum's return (the ranks' medians and percentiles, chunks
sent once); and each NIC's bytes each way over the run, from the Open vSwitch counters of the switch port its
circuit lands on (`ovs-ofctl dump-ports`, read before and after), per iteration and in units of S: a NIC sends and
receives S per
iteration aggregating, 2(n-1)/n S around a ring (1.5 S at 4 GPUs, S at 2, where no gain is expected: the record says
whether one was seen).

The prediction beside each configuration is the simulator's (`optirack simulate`'s model): the job alone on the same
rack with the same cabling: under one switch policy `regroup` for the ring and `panama` for aggregation, spread the
GPUs kept where they are (`fixed`) and one aggregator at the first switch (collective `ina-root`: each rank under
the other switch streams its own gradient to it, as on the rack), with the network calibrated from the newest whole
`make demo` record of the current model (simulator/model/calibration.py), in rack seconds: the emulated times
divided by the rack's time dilation. It models the aggregator at line rate: the slot pool's window and the
aggregator's own software are not in it. Needs root and the worker image; for a record, run it with nothing else
running on the machine:

    python -m scripts.bench_aggregate --matrix --json results/bench/<UTC>-<commit>-bench_aggregate.json

With the defaults (5 runs of each collective, 12 iterations a run) the matrix's 80 runs take about 17 minutes here
(--repeats 1: its 16 runs in 207 s, rack and controller brought up included).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    from scripts.stats import add_json_option, write_json
except ModuleNotFoundError:  # run as a file: scripts/ itself is on sys.path
    from stats import add_json_option, write_json

COLLECTIVES = ("ring", "aggregate")
PLACEMENTS = ("one", "spread")
MODELS = ("vgg16", "resnet50")
ENDED = ("done", "failed", "stopped")
BAR = 1.3  # the all-reduce's speed-up asked at 4 GPUs and more under one switch (the bytes' bound there: 1.5x)
CHUNK_COUNTS = ("sent", "resent", "received", "ignored", "dropped")
GAIN_SEEN = 1.05  # an all-reduce speed-up beyond this where no bar is set is a gain seen


def bar_for(cfg: dict) -> float | None:
    """The all-reduce's bar of a configuration: BAR at 4 GPUs and more under one switch (each NIC carries S against
    the ring's 2(n-1)/n S); none at 2 GPUs (the same bytes either way) nor spread, where each rank under the other
    switch streams its own gradient across the uplink to the one aggregator (2 S each way on it at 4 GPUs, against
    the ring's 1.5 S: a loss the simulator's `ina-root` predicts); whether a gain was seen is said instead."""
    return BAR if cfg["n"] >= 4 and cfg["placement"] == "one" else None
BYTES_TOLERANCE = 0.10  # a NIC's bytes each way against the bound: headers, the collective's set-up, resent chunks


# --- pure parts (tests/unit/test_bench_aggregate.py) ----------------------------------------------------------
def run_figures(lines: dict[str, list[dict]]) -> dict:
    """One run's figures from each GPU's JSON lines: the medians over iterations (the first left out) of the
    slowest rank's all-reduce and iteration time (emulated seconds), whether every sum was exact, and the
    collective the ranks' start lines name (one, or 'mixed')."""
    if not lines:
        raise ValueError("a run without any worker's lines")
    per_rank = []
    for gpu, records in sorted(lines.items()):
        its = {r["iteration"]: r for r in records if r.get("event") == "iteration"}
        if not its:
            raise ValueError(f"{gpu}: no iteration line")
        per_rank.append(its)
    common = sorted(set.intersection(*(set(r) for r in per_rank)))
    kept = common[1:] or common
    comm = [max(r[i]["comm_s"] for r in per_rank) for i in kept]
    iters = [max(r[i]["iter_s"] for r in per_rank) for i in kept]
    starts = {r.get("collective", "ring") for records in lines.values() for r in records if r.get("event") == "start"}
    done = [next((r for r in reversed(records) if r.get("event") == "done"), None) for records in lines.values()]
    sizes = {r["gradient_bytes"] for records in lines.values() for r in records
             if r.get("event") == "start" and "gradient_bytes" in r}
    trips = [r["round_trip"] for records in lines.values() for r in records
             if r.get("event") == "aggregated" and r.get("round_trip", {}).get("count")]
    # each rank's chunks (the aggregation client's counts, containers/aggclient.py): sent once, sent again, sums
    # received, datagrams ignored (a sum that came twice, another collective's)
    chunks = {gpu: {k: a[k] for k in CHUNK_COUNTS if k in a} for gpu, records in sorted(lines.items())
              for a in records if a.get("event") == "aggregated"}
    return {"iterations": len(kept), "all_reduce_s": statistics.median(comm), "iteration_s": statistics.median(iters),
            "exact_sums": all(d is not None and d.get("check") == "ok" for d in done),
            "collective_run": starts.pop() if len(starts) == 1 else "mixed" if starts else "no start line",
            "iterations_run": len(common), "gradient_bytes": sizes.pop() if len(sizes) == 1 else None,
            "round_trip_ms": {k: statistics.median(t[k] for t in trips) for k in ("p10_ms", "median_ms", "p90_ms")}
            if trips else None, "chunks": chunks or None}


def expected_factor(collective: str, n: int) -> float:
    """Bytes each way at each NIC per iteration, in units of the gradient S: S aggregating, 2(n-1)/n S in a ring."""
    return 1.0 if collective == "aggregate" else 2 * (n - 1) / n


def port_counters(text: str) -> tuple[int, int]:
    """(received, transmitted) bytes of the one port in `ovs-ofctl dump-ports SWITCH PORT`'s output: what the port
    took from the NIC on its circuit (the NIC sent) and gave it (the NIC received)."""
    rx = re.search(r"rx pkts=\d+, bytes=(\d+)", text)
    tx = re.search(r"tx pkts=\d+, bytes=(\d+)", text)
    if rx is None or tx is None:
        raise ValueError(f"no byte counters in dump-ports output: {text.strip()[:200]!r}")
    return int(rx.group(1)), int(tx.group(1))


def nic_bytes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], gradient_bytes: int,
              iterations: int) -> dict[str, dict]:
    """Each GPU's NIC: bytes sent and received over a run (its switch port's counters, after less before), and per
    iteration in units of the gradient S."""
    if gradient_bytes <= 0 or iterations <= 0:
        raise ValueError(f"gradient bytes {gradient_bytes} and iterations {iterations} must be positive")
    out = {}
    for gpu in sorted(before):
        sent, received = after[gpu][0] - before[gpu][0], after[gpu][1] - before[gpu][1]
        if sent < 0 or received < 0:
            raise ValueError(f"{gpu}: its port's counters went back ({before[gpu]} -> {after[gpu]})")
        out[gpu] = {"sent": sent, "received": received, "sent_s": sent / gradient_bytes / iterations,
                    "received_s": received / gradient_bytes / iterations}
    return out


def bytes_summary(runs: list[dict], collective: str, n: int, tolerance: float = BYTES_TOLERANCE) -> dict | None:
    """Every NIC's bytes each way per iteration in units of S over the collective's runs (min, median, max), the
    bound (`expected_factor`), and whether each one is within `tolerance` of it (above: headers, set-up, resent
    chunks; below: none should be). None where no run has counters."""
    vals = {"sent_s": [], "received_s": []}
    for r in runs:
        if r["collective"] == collective and r.get("nic"):
            for v in r["nic"].values():
                for k in vals:
                    vals[k].append(v[k])
    if not vals["sent_s"]:
        return None
    bound = expected_factor(collective, n)
    out: dict = {"expected_s": bound}
    for k, xs in vals.items():
        out[k] = {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}
    out["within"] = all(abs(x / bound - 1) <= tolerance for xs in vals.values() for x in xs)
    return out


def gather(seen: dict[str, dict[str, None]], logs: dict[str, list[str]]) -> None:
    """Add each worker's JSON lines not seen before to `seen` (by GPU, in the order first seen), heartbeats left out:
    the controller serves only a worker's last lines, so a run's lines are gathered over several reads."""
    for gpu, xs in logs.items():
        mine = seen.setdefault(gpu, {})
        for x in xs:
            if x in mine or not x.startswith("{"):
                continue
            try:
                if json.loads(x).get("event") != "alive":
                    mine[x] = None
            except ValueError:
                continue


def summarise(runs: list[dict], dilation: float, predicted: dict[str, float], bar: float | None = BAR,
              tolerance: float = 0.10, n: int = 4) -> dict:
    """Per collective the median over runs of each run's medians (rack seconds for iterations), the all-reduce's and
    the iteration's speed-up of aggregate over ring, the simulator's predicted iteration time and speed-up, each
    run's error against it, each NIC's bytes each way (`bytes_summary`, n GPUs), and what holds: all-reduce >= `bar`
    x faster (None: no bar (bar_for), where whether a gain beyond GAIN_SEEN was seen is said instead), every run
    within `tolerance` of the prediction, every sum exact, every run the collective it asked for, and every NIC's
    bytes within BYTES_TOLERANCE of the bound where counted."""
    out: dict = {}
    for c in COLLECTIVES:
        mine = [r for r in runs if r["collective"] == c]
        if not mine:
            raise ValueError(f"no {c} run to summarise")
        for r in mine:
            r["iteration_rack_s"] = r["iteration_s"] / dilation
            r["predicted_iteration_rack_s"] = predicted[c]
            r["error"] = r["iteration_rack_s"] / predicted[c] - 1
        out[c] = {"runs": len(mine), "all_reduce_s": statistics.median(r["all_reduce_s"] for r in mine),
                  "iteration_rack_s": statistics.median(r["iteration_rack_s"] for r in mine),
                  "predicted_iteration_rack_s": predicted[c], "bytes": bytes_summary(runs, c, n)}
    ring, agg = out["ring"], out["aggregate"]
    errors = [r["error"] for r in runs]
    speedup = ring["all_reduce_s"] / agg["all_reduce_s"]
    checks = {"all_reduce_at_least_bar": speedup >= bar} if bar is not None else {}
    checks.update({"every_run_within_tolerance": all(abs(e) <= tolerance for e in errors),
                   "exact_sums": all(r["exact_sums"] for r in runs),
                   "ran_as_asked": all(r["collective_run"] == r["collective"] for r in runs)})
    counted = [out[c]["bytes"] for c in COLLECTIVES if out[c]["bytes"] is not None]
    if counted:
        checks["bytes_as_bound"] = all(b["within"] for b in counted)
    out.update(
        all_reduce_speedup=speedup,
        iteration_speedup=ring["iteration_rack_s"] / agg["iteration_rack_s"],
        predicted_iteration_speedup=predicted["ring"] / predicted["aggregate"],
        worst_error=max(errors, key=abs), checks=checks, bar=bar, tolerance=tolerance, gpus=n)
    if bar is None:
        out["gain_seen"] = speedup > GAIN_SEEN
    return out


def matrix(sizes: list[int], models: list[str], placements: list[str]) -> list[dict]:
    """The configurations, in the order they run: {"n", "model", "placement"} for each combination."""
    return [{"n": n, "model": m, "placement": p} for n in sizes for m in models for p in placements]


def cabling(placement: str, gpus: list[str], switches: list[str]) -> dict[str, list[str]]:
    """Switch -> the GPUs cabled under it: `one`, all under the first switch (the aggregator's); `spread`, the first
    half there, the rest under the second."""
    if placement == "one":
        return {switches[0]: list(gpus)}
    if placement != "spread":
        raise ValueError(f"placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
    if len(switches) < 2 or len(gpus) < 2:
        raise ValueError("spread needs 2 switches and 2 GPUs or more")
    half = (len(gpus) + 1) // 2
    return {switches[0]: list(gpus[:half]), switches[1]: list(gpus[half:])}


def order(repeats: int) -> list[str]:
    """ring, aggregate, then aggregate, ring, ...: each collective first in half the pairs."""
    return [c for i in range(repeats) for c in (COLLECTIVES if i % 2 == 0 else COLLECTIVES[::-1])]


# --- the simulator's prediction ------------------------------------------------------------------------------
def cabled_rack(rack_file: Path, under: dict[str, list[str]]):
    """The rack of `rack_file` with the GPUs cabled under the switches as `under` says (their circuits in place of
    those on the same ports, the others kept), and those circuits."""
    import yaml

    from controller.core.rack import load_rack, parse_rack

    try:
        from scripts.bench_allreduce import ring_circuits
    except ModuleNotFoundError:
        from bench_allreduce import ring_circuits

    rack = load_rack(rack_file)
    circuits = [c for switch, gpus in under.items() for c in ring_circuits(rack, switch, gpus)]
    ours = {q for c in circuits for q in c}
    data = yaml.safe_load(rack_file.read_text())
    data["circuits"] = [c for c in data.get("circuits", []) if not {str(q) for q in c} & ours] + circuits
    return parse_rack(data, str(rack_file)), circuits


def predict(rack, gpus: list[str], model: str, iterations: int, placement: str = "one") -> tuple[dict[str, float], str]:
    """The simulator's mean iteration time (rack seconds) of the job alone on `rack` (cabled as the run is), ring and
    aggregate: under one switch `regroup` and `panama`; spread, its GPUs kept where they are (`fixed`) and one
    aggregator, at its first switch (collective `ina-root`: each GPU under the other switch streams its own gradient
    there, as the rack's ranks do); and the calibration's source."""
    from evidence import records as rec
    from evidence.report import engine as report_engine
    from simulator.inputs.workloads import JobSpec
    from simulator.model import calibration, neighbours
    from simulator.model.engine import Options, policies

    whole = report_engine.current(rec.load())
    cal = calibration.from_record(whole[-1].data if whole else None)
    source = cal.source + (f" ({whole[-1].path.name})" if whole else "")
    job = JobSpec("bench", 0.0, len(gpus), model, iterations, tuple(gpus))
    options = Options(net=cal.net(rack), step_model="exact")
    if placement == "one":
        chosen = {"ring": policies(300.0)["regroup"], "aggregate": neighbours.policies()["panama"]}
    else:
        chosen = {"ring": policies(300.0)["fixed"], "aggregate": neighbours.NeighbourPolicy(
            "aggregator-fixed", "fixed", label="in place + one aggregator at the first switch", collective="ina-root")}
    out = {}
    for c, policy in chosen.items():
        out[c] = neighbours.run_class(policy)(rack, [job], policy, options).run().jobs[0].mean_iteration_s
    return out, source


# --- the rack -----------------------------------------------------------------------------------------------
def run_job(client, gpus: list[str], collective: str, workload: dict, timeout: float) -> dict:
    """Submit one job of `workload` on `gpus` with `collective`, wait for its end and gather its workers' lines; its
    figures (run_figures), and every line by GPU under "lines"."""
    job = client.post("/jobs", {"gpus": gpus, "collective": collective, "policy": "regroup", "queue": False,
                                "checkpoint_every": workload["iterations"] + 1, "warm_spares": 0,
                                "workload": workload})["job"]
    deadline, seen = time.monotonic() + timeout, {}
    while True:  # the controller serves each worker's last lines (heartbeats among them): gather them as they come
        now = client.get(f"/jobs/{job['id']}")["job"]
        gather(seen, client.get(f"/jobs/{job['id']}/logs")["logs"])
        if now["state"] in ENDED:
            break
        if time.monotonic() > deadline:
            client.delete(f"/jobs/{job['id']}")
            raise RuntimeError(f"job {job['id']} ({collective}) did not end within {timeout:g} s")
        time.sleep(0.25)
    if now["state"] != "done":
        raise RuntimeError(f"job {job['id']} ({collective}) ended {now['state']}: {now.get('reason')}")
    lines = {g: [json.loads(x) for x in xs] for g, xs in seen.items()}
    return {"collective": collective, "job": now["id"], "switches": now["switches"],
            "aggregation": now.get("aggregation"), **run_figures(lines), "lines": lines}


def run_direct(rack, gpus: list[str], collective: str, workload: dict, timeout: float, port: int, key: int,
               aggregator, tmp: Path) -> dict:
    """The job's ranks started by hand, each a worker process in its server's namespace on its NIC, with the flags the
    controller gives its workers (and, aggregating, `aggregator`'s address and the job's `key` there); as run_job."""
    from controller.core.emulated import netns_of

    e = rack.spec.emulation
    procs = []
    try:
        for rank, g in enumerate(gpus):
            cmd = ["ip", "netns", "exec", netns_of(rack.server_of[g]), sys.executable, "-m", "containers.worker",
                   "--rank", str(rank), "--world-size", str(len(gpus)), "--master", rack.addresses[gpus[0]][0],
                   "--master-port", str(port), "--mode", "profile", "--iterations", str(workload["iterations"]),
                   "--rate-scale", str(e.rate_scale), "--time-dilation", str(e.time_dilation),
                   "--workload", workload["model"], "--gpu-model", rack.gpus[g].model, "--ifname", rack.interface(g),
                   "--checkpoint-every", str(workload["iterations"] + 1), "--checkpoint-dir", str(tmp / f"ck{rank}"),
                   "--control-dir", str(tmp / f"control{rank}"), "--timeout", str(int(timeout)),
                   "--wait-for-nic", "60"]  # a NIC a container of the run before still held comes back to its server
            if collective == "aggregate":
                cmd += ["--collective", "aggregate", "--aggregator", aggregator.address, "--aggregation-job", str(key)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
        lines = {}
        deadline = time.monotonic() + timeout
        for g, proc in zip(gpus, procs, strict=True):
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                tails = [f"{h}: {q.communicate()[1].strip()[-600:]}" for h, q in zip(gpus, procs, strict=True)]
                raise RuntimeError(f"the {collective} run did not end within {timeout:g} s; " + " | ".join(tails)) \
                    from None
            if proc.returncode != 0:
                raise RuntimeError(f"{g}'s worker ({collective}) exited {proc.returncode}: {err.strip()[-1500:]}")
            lines[g] = [json.loads(x) for x in out.splitlines() if x.startswith("{") and '"alive"' not in x]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"collective": collective, "job": f"by hand, key {key}", "switches": [],
            "aggregation": {"collective": "aggregate", "address": aggregator.address, "key": key}
            if collective == "aggregate" else None, **run_figures(lines), "lines": lines}


SETTLE = ("ovs-appctl", "revalidator/wait")


def counters(locations: dict[str, tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """Each GPU's switch port's (received, transmitted) bytes, from Open vSwitch (`ovs-ofctl dump-ports`), read once
    the bytes already through are counted. A patch port (the emulated rack joins its bridges by them) has no kernel
    counters: ovs-vswitchd adds the datapath flows' bytes to it when its revalidators next pass, about every 0.5 s,
    so read at once after a run its counters lack the run's last iteration, which the next run's count then carries
    (a ring of 4 x resnet50 spread read 1.41 S per NIC after an aggregating run and 1.62 S after a ring, where each
    NIC carries 1.5 S). `revalidator/wait` twice: the first may return as a pass begun before the run ended does."""
    for _ in range(2):
        subprocess.run(SETTLE, capture_output=True, text=True, check=True)
    out = {}
    for g, (switch, port) in sorted(locations.items()):
        proc = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", switch, str(port)], capture_output=True,
                              text=True, check=True)
        out[g] = port_counters(proc.stdout)
    return out


def cable(tb, circuits: list[list[str]]) -> None:
    """Put the circuits in place by the OCS (the others kept), so that the job is placed where they put it."""
    ours = {q for c in circuits for q in c}
    kept = [c for c in tb.client.get("/ocs/circuits")["circuits"] if not set(c) & ours]
    tb.client.put("/ocs/circuits", {"circuits": kept + circuits})


def reachable(rack, gpus: list[str], address: str, within: float = 30.0) -> None:
    """Route the rack's subnet through each GPU's NIC in its server (a server with two NICs, the other one not on the
    job's circuits, may route it through that one: its rank then never reached the master's store), and wait until
    every one reaches `address` (the master's)."""
    from controller.core.emulated import netns_of

    deadline, subnet = time.monotonic() + within, str(rack.spec.network.subnet)
    for g in gpus:
        ns = ["ip", "netns", "exec", netns_of(rack.server_of[g])]
        subprocess.run([*ns, "ip", "route", "replace", subnet, "dev", rack.interface(g), "src",
                        rack.addresses[g][0]], check=True, capture_output=True)
        while subprocess.run([*ns, "ping", "-c", "1", "-W", "1", address], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{g} does not reach {address} within {within:g} s")


RUNS = iter(range(10**6))  # every run by hand its own master port and aggregation key


def one_run(tb, cfg: dict, gpus: list[str], collective: str, workload: dict, timeout: float, agg) -> dict:
    """One run of the configuration: through the REST API under one switch, by hand spread."""
    if cfg["placement"] == "one":
        r = run_job(tb.client, gpus, collective, workload, timeout)
        if r["switches"] != [agg.switch]:
            raise RuntimeError(f"{collective} run placed under {r['switches']}, not {agg.switch}")
        return r
    reachable(tb.rack, gpus, tb.rack.addresses[gpus[0]][0])
    k = next(RUNS)
    with tempfile.TemporaryDirectory() as tmp:
        return run_direct(tb.rack, gpus, collective, workload, timeout, 29700 + k % 1000, 0x5EED0000 + k, agg,
                          Path(tmp))


def run_config(tb, args, cfg: dict, agg, switches: list[str], log) -> dict:
    """One configuration's runs, alternately ring and aggregate, with each NIC's bytes; its summary. `agg`: the
    aggregator (on switches[0]), `switches`: where `cabling` puts the GPUs."""
    from controller.core.circuits import CircuitMap

    pool = args.gpus.split(",")
    gpus = pool[:cfg["n"]]
    under = cabling(cfg["placement"], gpus, switches)
    crack, circuits = cabled_rack(args.topo, under)
    predicted, source = predict(crack, gpus, cfg["model"], args.iterations, cfg["placement"])
    where = CircuitMap.parse(crack, circuits).gpu_locations(crack)
    cabled = "; ".join(f"{w}: " + ", ".join(g) for w, g in under.items())
    log(f"{cfg['n']} x {cfg['model']}, {cfg['placement']} ({cabled}): simulated ring {predicted['ring']:.3f} s, "
        f"aggregate {predicted['aggregate']:.3f} s per iteration (rack)")
    cable(tb, circuits)
    workload = {"model": cfg["model"], "iterations": args.iterations}
    runs = []
    for i, collective in enumerate(order(args.repeats)):
        for attempt in (1, 2):  # a run that fails is run again once (said in the record), then the benchmark stops
            before = counters(where)
            try:
                r = one_run(tb, cfg, gpus, collective, workload, args.timeout, agg)
            except (RuntimeError, OSError) as e:
                if attempt == 2:
                    raise
                log(f"  run {i + 1} ({collective}) failed, running it again: {e}")
                failed = str(e)
                continue
            if attempt == 2:
                r["failed_first"] = failed
            break
        if cfg["placement"] != "one":
            r["switches"] = sorted(under)
        after = counters(where)
        del r["lines"]
        r["nic"] = nic_bytes(before, after, r["gradient_bytes"] or 1, r["iterations_run"])
        r["where"] = {g: list(at) for g, at in where.items()}
        runs.append(r)
        nic = r["nic"]
        log(f"  run {i + 1}/{2 * args.repeats} {collective:9s}: all-reduce {r['all_reduce_s']:.3f} s, iteration "
            f"{r['iteration_s']:.3f} s (emulated; median of {r['iterations']}), NIC bytes per iteration / S: sent "
            f"{min(v['sent_s'] for v in nic.values()):.2f}-{max(v['sent_s'] for v in nic.values()):.2f}, received "
            f"{min(v['received_s'] for v in nic.values()):.2f}-{max(v['received_s'] for v in nic.values()):.2f}; "
            f"sums exact: {r['exact_sums']}, ran as {r['collective_run']}" + (
                f"; a chunk's round trip {r['round_trip_ms']['median_ms']:.1f} ms (median of the ranks' medians; "
                f"p10 {r['round_trip_ms']['p10_ms']:.1f}, p90 {r['round_trip_ms']['p90_ms']:.1f})"
                if r["round_trip_ms"] else "") + (
                "; chunks sent again per rank: " + ", ".join(f"{c.get('resent', 0)} of {c.get('sent', 0)}"
                                                             for c in r["chunks"].values()) if r["chunks"] else ""))
    s = summarise(runs, tb.rack.spec.emulation.time_dilation, predicted, bar_for(cfg), n=cfg["n"])
    log(f"  aggregate over ring: all-reduce {s['all_reduce_speedup']:.2f}x, iteration {s['iteration_speedup']:.2f}x "
        f"(simulated {s['predicted_iteration_speedup']:.2f}x); worst run against the simulator "
        f"{100 * s['worst_error']:+.1f} %; checks: {s['checks']}")
    return {**cfg, "gpus": gpus, "under": under, "aggregator": agg.switch, "simulator": source, "runs": runs,
            "summary": s}


def main(argv: list[str] | None = None) -> int:
    from controller.core.aggregators import aggregators
    from controller.core.rack import load_rack
    from emulation.harness import Testbed

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topo", type=Path, default=ROOT / "topologies" / "paper-testbed.yaml")
    p.add_argument("--gpus", default="gpu1,gpu2,gpu3,gpu4", help="the GPUs a job of N takes the first N of "
                   "(default %(default)s)")
    p.add_argument("--sizes", default="4", help="the jobs' GPU counts, comma-separated (default %(default)s)")
    p.add_argument("--models", default="vgg16", help=f"comma-separated, of {', '.join(MODELS)} (default %(default)s)")
    p.add_argument("--placements", default="one", help=f"comma-separated, of {', '.join(PLACEMENTS)} "
                   "(default %(default)s)")
    p.add_argument("--matrix", action="store_true", help="every configuration: sizes 2,4, models vgg16,resnet50, "
                   "placements one,spread")
    p.add_argument("--repeats", type=int, default=5, help="runs of each collective per configuration "
                   "(default %(default)s)")
    p.add_argument("--iterations", type=int, default=12, help="iterations per run (default %(default)s)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one run may take (default %(default)s)")
    add_json_option(p)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.iterations < 2:
        p.error("--repeats must be at least 1 and --iterations at least 2")
    if args.matrix:
        args.sizes, args.models, args.placements = "2,4", ",".join(MODELS), ",".join(PLACEMENTS)
    rack = load_rack(args.topo)
    pool = args.gpus.split(",")
    unknown = sorted(set(pool) - set(rack.gpus))
    if unknown or len(set(pool)) != len(pool):
        p.error(f"--gpus: distinct GPUs of {args.topo.name}" + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: comma-separated whole numbers, not {args.sizes!r}")
    if any(n < 2 or n > len(pool) for n in sizes):
        p.error(f"--sizes: each from 2 to the {len(pool)} GPUs of --gpus")
    models, placements = args.models.split(","), args.placements.split(",")
    for name, xs, allowed in (("--models", models, MODELS), ("--placements", placements, PLACEMENTS)):
        if not xs or set(xs) - set(allowed):
            p.error(f"{name}: of {', '.join(allowed)}, not {', '.join(sorted(set(xs) - set(allowed)))}")
    aggs = aggregators(rack)
    if not aggs:
        p.error(f"{args.topo.name}: no switch with an in-network aggregator")
    switches = [aggs[0].switch] + [w for w in rack.switches if w != aggs[0].switch]
    if "spread" in placements and len(switches) < 2:
        p.error(f"{args.topo.name}: spread needs two switches")

    def log(text: str) -> None:
        print(text, flush=True)

    from containers.image import ensure_images

    ensure_images()  # the workers the controller starts run this tree's code (another checkout may have built its own)
    configs = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, Testbed(rack, args.topo, Path(tmp)) as tb:
        for cfg in matrix(sizes, models, placements):
            configs.append(run_config(tb, args, cfg, aggs[0], switches, log))
    log(f"{len(configs)} configuration(s) in {time.monotonic() - t0:.0f} s")
    write_json(args.json, {"rack": rack.name, "time_dilation": rack.spec.emulation.time_dilation,
                           "iterations": args.iterations, "repeats": args.repeats, "configs": configs})
    return 0


if __name__ == "__main__":
    sys.exit(main())

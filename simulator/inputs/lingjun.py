"""Alibaba's Lingjun 2023 trace (alibaba/alibaba-lingjun-dataset-2023; Crux, SIGCOMM 2024): its rack and its jobs
where they ran, so that `--policies fixed` replays the recorded placements and `regroup` rewires the same GPUs.

The folder holds the three tables as published:
- `topo.csv`: ip, DSW, PSW, ASW: each host's ToR (ASW), aggregation (PSW) and core (DSW) switch;
- `job.csv`: a job per row; used: job_name, gmt_job_submitted, gmt_job_running, gmt_job_finished (times
  "2023/7/15 02:19"); jobs that never ran or have no end are left out and counted;
- `worker.csv`: a worker per row; used: job_name, host_ip, RES (JSON: the worker's "nvidia.com/gpu").

The rack: one aggregator switch per ASW under one core (the trace's PSW and DSW tiers folded into it), hosts
of `gpus_per_host` GPUs (8, assumed) under their ASW, ordered by (DSW, PSW, ASW, ip); each switch's uplink
at its mean GPUs x NIC rate / oversubscription. A job asks for the GPUs its workers held, host by host, each
host's lowest GPUs free at its start (the trace names hosts, not GPUs); its run time is recorded
(gmt_job_running to gmt_job_finished), its arrival gmt_job_submitted. The trace names no model: every job
runs `model`.
"""
from __future__ import annotations

import csv
import io
import json
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

from controller.core.rack import Rack, parse_rack
from controller.core.rackgen import rack_spec
from simulator.inputs import racks
from simulator.inputs.workloads import JobSpec, TraceError, read_text

FILES = ("topo.csv", "job.csv", "worker.csv")
GPUS_PER_HOST = 8


def _rows(folder: Path, name: str, need: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    path = folder / name
    text = read_text(path)
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{path}: no column {', '.join(missing)} (the Lingjun trace's {name} names them)")
    return list(enumerate(reader, 2))


def _time(text: str) -> float | None:
    text = (text or "").strip()
    for fmt in ("%Y/%m/%d %H:%M:%S", "%Y/%m/%d %H:%M", "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


def hosts(folder: str | Path) -> list[tuple[str, str]]:
    """(ip, ASW) of every host, in rack order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(f"{folder}: the Lingjun trace is a folder of {', '.join(FILES)}")
    rows = _rows(folder, "topo.csv", ("ip", "DSW", "PSW", "ASW"))
    if not rows:
        raise TraceError(f"{folder / 'topo.csv'}: no hosts")
    return [(r["ip"], r["ASW"]) for _, r in sorted(rows, key=lambda x: (x[1]["DSW"], x[1]["PSW"], x[1]["ASW"],
                                                                        x[1]["ip"]))]


def rack(folder: str | Path, nic_gbps: float = 100.0, oversubscription: float = 16.0, model: str = "A100",
         gpus_per_host: int = GPUS_PER_HOST) -> Rack:
    """The trace's rack: an aggregator per ASW, its hosts under it (module docstring)."""
    order = hosts(folder)
    switches = list(dict.fromkeys(asw for _, asw in order))
    index = {asw: w for w, asw in enumerate(switches)}
    gpus = len(order) * gpus_per_host
    biggest = max(Counter(asw for _, asw in order).values()) * gpus_per_host
    spare = biggest / (gpus / len(switches))  # room for the largest ASW's GPUs on every OCS
    ocs, _ = racks.choose_ocs(gpus, len(switches), spare)
    uplink = round(gpus / len(switches) * nic_gbps / oversubscription, 3)
    spec = rack_spec(gpus, gpus_per_server=gpus_per_host, switches=len(switches), ocs=ocs, model=model,
                     nic_gbps=nic_gbps, uplink_gbps=uplink, name="lingjun", spare=spare)
    per = len(spec["switches"][0]["downlinks"]) // ocs
    gpu_ports = gpus // ocs
    used: dict[tuple[int, int], int] = defaultdict(int)
    circuits = []
    for g in range(gpus):
        w, o = index[order[g // gpus_per_host][1]], g % ocs
        k = used[(w, o)]
        used[(w, o)] += 1
        circuits.append([f"o{o + 1}:{g // ocs + 1}", f"o{o + 1}:{gpu_ports + w * per + k + 1}"])
    spec["circuits"] = circuits
    spec["description"] = f"Lingjun 2023 trace: {len(order)} hosts under {len(switches)} ASWs, {ocs} OCS"
    return parse_rack(spec, f"<Lingjun trace {folder}>")


def load(folder: str | Path, model: str = "resnet50", gpus_per_host: int = GPUS_PER_HOST) \
        -> tuple[list[JobSpec], Counter]:
    """The trace's jobs, each naming the GPUs it ran on, and the jobs left out by reason."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(f"{folder}: the Lingjun trace is a folder of {', '.join(FILES)}")
    server = {ip: i for i, (ip, _) in enumerate(hosts(folder))}
    held: dict[str, list[tuple[str, int]]] = defaultdict(list)  # job -> (host, GPUs) per worker
    left = Counter()
    for no, r in _rows(folder, "worker.csv", ("job_name", "host_ip", "RES")):
        try:
            gpus = int(json.loads(r["RES"] or "{}").get("nvidia.com/gpu", 0) or 0)
        except (ValueError, AttributeError):
            raise TraceError(f"{folder / 'worker.csv'}: line {no}: RES: {r['RES']!r} is not the JSON of a "
                             "worker's resources") from None
        if gpus > 0:
            held[r["job_name"]].append((r["host_ip"], gpus))
    raw = []
    for no, r in _rows(folder, "job.csv", ("job_name", "gmt_job_submitted", "gmt_job_running",
                                            "gmt_job_finished")):
        start, end = _time(r["gmt_job_running"]), _time(r["gmt_job_finished"])
        submitted = _time(r["gmt_job_submitted"])
        workers = held.get(r["job_name"], [])
        if start is None or end is None:
            left["never ran or no end"] += 1
        elif end <= start:
            left["no run time"] += 1
        elif not workers:
            left["no GPU"] += 1
        elif any(ip not in server for ip, _ in workers):
            left["on a host topo.csv lacks"] += 1
        else:
            raw.append((min(submitted if submitted is not None else start, start), start, end, r["job_name"],
                        workers, no))
    raw.sort(key=lambda x: (x[1], x[5]))
    free_at: dict[int, list[float]] = defaultdict(lambda: [0.0] * gpus_per_host)  # host -> each GPU's release
    jobs = []
    first = min((a for a, *_ in raw), default=0.0)
    for i, (arrival, start, end, name, workers, no) in enumerate(raw):
        per_host: dict[int, int] = Counter()
        for ip, n in workers:
            per_host[server[ip]] += n
        names = []
        for s, n in sorted(per_host.items()):
            if n > gpus_per_host:
                raise TraceError(f"{folder / 'job.csv'}: line {no}: job {name} holds {n} GPUs on one host "
                                 f"(hosts have {gpus_per_host})")
            slots = sorted(range(gpus_per_host), key=lambda k, s=s: (free_at[s][k] > start, free_at[s][k], k))[:n]
            for k in sorted(slots):
                free_at[s][k] = end
                names.append(f"g{s * gpus_per_host + k + 1}")
        jobs.append(JobSpec(f"j{i + 1}", arrival - first, len(names), model, 0, names=tuple(names),
                            duration_s=end - start, label=name, source=f"{folder / 'job.csv'}:{no}"))
    jobs.sort(key=lambda j: (j.arrival_s, j.id))
    return jobs, left


def with_iterations(jobs: list[JobSpec], rack: Rack, net, nvlink_gbps: float = 0.0) -> list[JobSpec]:
    """Each job's recorded run time as iterations alone where it ran (its named GPUs on the trace's cabling), so
    that `fixed` keeps the recorded run times of jobs alone and another policy's placement can change them (by
    duration, each policy would derive them from its own placement and every policy would keep them)."""
    from dataclasses import replace

    from simulator.model import models
    from simulator.model.adapter import Placer
    from simulator.model.network import GBPS, Fabric, ring_net
    from simulator.model.rings import Ring, alone_rate, iteration_time

    fabric, placer = Fabric(rack), Placer(rack)
    capacity = [c * net.efficiency for c in fabric.capacity]
    server_gpus = max(len(s.gpus) for s in rack.spec.servers)
    out = []
    for j in jobs:
        if not j.names or not j.duration_s:
            out.append(j)
            continue
        nic = min(rack.gpus[g].nic.rate_gbps for g in j.names) * GBPS
        c = models.cost(j.model, [rack.gpus[g].model for g in j.names], server_gpus, nvlink_gbps * GBPS, nic)
        rn = ring_net(fabric, list(j.names), placer.switch_of(list(j.names)), nvlink_gbps * GBPS)
        ring = Ring(0, max(c.compute_s), 0.0, len(j.names), c.gradient_bytes, rn.cap * net.efficiency, rn.links)
        alone = iteration_time(ring, alone_rate(ring, capacity), net.step_latency_s)
        out.append(replace(j, iterations=max(1, round(j.duration_s / alone)), duration_s=0.0))
    return out

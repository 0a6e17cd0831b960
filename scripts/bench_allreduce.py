#!/usr/bin/env python3
"""Benchmark: fidelity of the emulated fabric for an uncongested ring all-reduce.

Four GPU containers under one aggregator switch (circuits set through the controller) run the
worker with no compute phase and a gradient of S bytes. Each iteration's bus bandwidth,
2(n-1)/n * S / t, is compared with the emulated line rate B; the host's idle CPU is read from
/proc/stat while they run. Needs root.

It also prints what a ring step costs beyond its bytes at the line rate, (t - bound) / 2(n-1): the
simulator's fixed cost per step (simulator/model/calibration.py STEP_S) is this, measured at the paper
cases' gradient on the default rack (the record it came from ran `--mbytes 0.528`, VGG16's 528 MiB taken as MB,
4.6 % under the 553 kB the cases send: 553 MB x rate scale 0.0005 x time dilation 2, i.e. `--mbytes 0.553`),
where every step's chunk crosses several store-and-forward hops of jumbo frames at the scaled rate.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from containers.image import WORKER_IMAGE
from controller.core.rack import load_rack
from controller.drivers.containers import ContainerDriver, container_name
from controller.jobs.ports import GpuContainer
from emulation.harness import ROOT, Testbed

try:
    from scripts.stats import add_json_option, show, spread, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, show, spread, write_json


def cpu_times() -> list[int]:
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def run_ring(tb: Testbed, gpus: list[str], size: int, iterations: int, image: str,
             allreduce: str = "ring", beside: list[list[str]] = ()) -> tuple[list[list[dict]], float]:
    """The ring `gpus` (and the rings `beside`, started with it and run alike, their figures not kept): each
    rank's JSON lines of the first ring, and the host's idle CPU % while they ran."""
    rack = tb.rack
    driver = ContainerDriver(rack, image)
    prefix = rack.spec.network.subnet.prefixlen
    started = []
    ranks = [(rank, gpu, ring) for ring in [gpus, *beside] for rank, gpu in enumerate(ring)]
    try:
        for rank, gpu, ring in ranks:
            master = rack.addresses[ring[0]][0]
            g = rack.gpus[gpu]
            cmd = [
                "--rank",
                str(rank),
                "--world-size",
                str(len(ring)),
                "--master",
                master,
                "--iterations",
                str(iterations),
                "--gradient-bytes",
                str(size),
                "--compute-seconds",
                "0",
                "--wait-for-nic",
                "60",
                "--allreduce",
                allreduce,
            ]
            driver.start(
                GpuContainer(
                    "bench", gpu, rack.server_of[gpu], g.index, g.model, gpu, f"{rack.addresses[gpu][0]}/{prefix}", cmd
                )
            )
            started.append(gpu)
        cpu0 = cpu_times()
        logs = []
        for _, gpu, ring in ranks:
            c = driver.client(rack.server_of[gpu]).containers.get(container_name("bench", gpu))
            status = c.wait(timeout=600)
            text = c.logs(stdout=True, stderr=False).decode()
            if status["StatusCode"] != 0:
                raise RuntimeError(f"worker on {gpu} failed: {c.logs().decode()[-1000:]}")
            if ring is gpus:
                logs.append([json.loads(line) for line in text.splitlines() if line.startswith("{")])
        cpu1 = cpu_times()
    finally:
        for gpu in started:
            driver.remove("bench", gpu, rack.server_of[gpu])
    delta = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    return logs, 100.0 * (delta[3] + delta[4]) / sum(delta)


def ring_circuits(rack, switch: str, gpus: list[str]) -> list[list[str]]:
    """Each GPU of the ring on a downlink of `switch` through the GPU's own OCS (a rack whose GPUs sit on
    two OCS, as topologies/trace16.yaml, pairs each with a downlink on its OCS)."""
    free = list(rack.switches[switch].downlinks)
    circuits = []
    for g in gpus:
        port = rack.gpu_port(g)
        d = next((d for d in free if d.ocs_port.device == port.device), None)
        if d is None:
            raise SystemExit(f"bench_allreduce: no free downlink of {switch} on {port.device} for {g}")
        free.remove(d)
        circuits.append([str(port), str(d.ocs_port)])
    return circuits


def comm_times(logs: list[list[dict]]) -> list[float]:
    """Each iteration's communication time: its slowest rank's."""
    its = zip(*[[x for x in log if x["event"] == "iteration"] for log in logs], strict=True)
    return [max(r["comm_s"] for r in it) for it in its]


def observed_rounds(tb: Testbed, args, gpus: list[str], size: int, bound_s: float, workdir: Path) -> dict:
    """Alternate runs without and with the live page open and Prometheus scraping every 5 s."""
    from emulation.observe import Browser, Prometheus

    runs = {"plain": [], "observed": []}
    for i in range(args.observed):
        order = ("plain", "observed") if i % 2 == 0 else ("observed", "plain")
        for kind in order:
            print(f"  round {i + 1}/{args.observed}: {kind} ...", flush=True)
            if kind == "plain":
                logs, _ = run_ring(tb, gpus, size, args.iterations, args.image, args.allreduce)
            else:
                target = tb.controller.url.removeprefix("http://")
                with Prometheus(workdir / f"prom-{i}", [target], scrape_interval="5s") as prom, Browser() as browser:
                    browser.page.goto(tb.controller.url + "/")
                    browser.page.wait_for_selector("#rack [data-gpu]", timeout=20_000)
                    logs, _ = run_ring(tb, gpus, size, args.iterations, args.image, args.allreduce)
                    scrapes = prom.query('count_over_time(up{job="optirack"}[10m])')
                    drawn = browser.page.eval_on_selector_all("#chart-ports polyline", "els => els.length")
                print(
                    f"    Prometheus scraped {scrapes[0]['value'][1] if scrapes else 0} times; "
                    f"the page drew {drawn} port series"
                )
            median = statistics.median(bound_s / c for c in comm_times(logs))
            runs[kind].append(median)
            print(f"    {100 * median:.1f} % of the bound", flush=True)
    plain, observed = statistics.mean(runs["plain"]), statistics.mean(runs["observed"])
    return {
        "plain_percent": [round(100 * f, 2) for f in runs["plain"]],
        "observed_percent": [round(100 * f, 2) for f in runs["observed"]],
        "plain_mean_percent": 100 * plain,
        "observed_mean_percent": 100 * observed,
        "difference_points": 100 * (plain - observed),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topo", type=Path, default=ROOT / "topologies" / "paper-testbed.yaml")
    p.add_argument("--gpus", default="gpu1,gpu2,gpu3,gpu4", help="the ring (default %(default)s)")
    p.add_argument("--beside", default="", metavar="RINGS",
                   help="rings run at the same time as the measured one, alike, in the rack file's cabling "
                        "(e.g. 'gpu5,gpu6,gpu7,gpu8;gpu9,gpu10,gpu11,gpu12'): the step cost on a loaded host")
    p.add_argument("--mbytes", type=float, default=12.8, help="gradient size S in MB (default %(default)s)")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--image", default=WORKER_IMAGE, help="worker image (default %(default)s)")
    p.add_argument("--allreduce", choices=["ring", "builtin"], default="ring", help="the worker's --allreduce")
    p.add_argument(
        "--observed",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="then ROUNDS pairs of runs, alternately without and with the live page open in headless "
        "Chromium and Prometheus scraping /metrics every 5 s; prints both and their difference "
        "in percentage points of the bound (needs the chromium and prometheus packages)",
    )
    add_json_option(p)
    args = p.parse_args(argv)
    rack = load_rack(args.topo)
    gpus = args.gpus.split(",")
    beside = [r.split(",") for r in args.beside.split(";") if r]
    every = gpus + [g for r in beside for g in r]
    unknown = sorted(set(every) - set(rack.gpus))
    if unknown or len(set(every)) != len(every) or any(len(r) < 2 for r in beside):
        p.error(f"--gpus/--beside: distinct GPUs of {args.topo.name}, rings of 2 or more"
                + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    switch = rack.aggregators()[0]
    circuits = ring_circuits(rack, switch, gpus)
    size = int(args.mbytes * 1e6)
    n = len(gpus)
    line_bps = rack.spec.emulation.mbps(rack.gpus[gpus[0]].nic.rate_gbps) * 1e6
    bound_s = 2 * (n - 1) / n * size * 8 / line_bps
    with tempfile.TemporaryDirectory() as tmp, Testbed(rack, args.topo, Path(tmp)) as tb:
        ours = {p for c in circuits for p in c}  # the ring's GPU ports and downlinks: every other circuit stays
        kept = [c for c in tb.client.get("/ocs/circuits")["circuits"] if not set(c) & ours]
        tb.client.put("/ocs/circuits", {"circuits": kept + circuits})
        t0 = time.monotonic()
        logs, idle = run_ring(tb, gpus, size, args.iterations, args.image, args.allreduce, beside)
        wall = time.monotonic() - t0
        observed = observed_rounds(tb, args, gpus, size, bound_s, Path(tmp)) if args.observed else None
    comm = comm_times(logs)
    fraction = spread([bound_s / c for c in comm], 100)
    bus = spread([2 * (n - 1) / n * size * 8 / c / 1e6 for c in comm])
    steps = 2 * (n - 1)
    beyond = spread([(c - bound_s) / steps for c in comm], 1000)  # what a step costs beyond its bytes at the line rate
    result = {
        "ring": gpus,
        "beside": beside,
        "switch": switch,
        "gradient_bytes": size,
        "line_mbps": line_bps / 1e6,
        "bound_s": bound_s,
        "comm_s": spread(comm),
        "percent_of_bound": fraction,
        "bus_mbps": bus,
        "steps": steps,
        "step_beyond_bound_ms": beyond,
        "idle_cpu_percent": idle,
        "wall_s": wall,
    }
    print(
        f"ring all-reduce of {n} under {switch}: S = {size / 1e6:g} MB, B = {line_bps / 1e6:g} Mbit/s, "
        f"bound 2(n-1)/n*S/B = {bound_s:.2f} s"
    )
    print("  per iteration: " + " ".join(f"{c:.2f}s" for c in comm))
    print(
        f"  median (min–max) over {len(comm)} iterations: bus bandwidth {show(bus, 'Mbit/s')} = "
        f"{show(fraction, '%')} of the bound; host idle CPU {idle:.0f} %"
    )
    print(
        f"  beyond the bound, per ring step ({steps} per all-reduce): {show(beyond, 'ms', 2)}; "
        f"per all-reduce {steps * beyond['median']:.1f} ms"
    )
    if observed:
        result["observed"] = observed
        print(
            f"  without the page and Prometheus: {observed['plain_mean_percent']:.1f} % of the bound "
            f"(runs: {', '.join(f'{x:.1f}' for x in observed['plain_percent'])})"
        )
        print(
            f"  with the page open and Prometheus scraping every 5 s: {observed['observed_mean_percent']:.1f} % "
            f"(runs: {', '.join(f'{x:.1f}' for x in observed['observed_percent'])})"
        )
        print(f"  difference: {observed['difference_points']:+.1f} percentage points of the bound")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: control-plane overhead of a reconfiguration on the emulated rack.

Overhead = time from the start of the reconfiguration (the controller's event timestamp) until
the switches confirmed the new forwarding, minus the modelled MEMS switching time. Measured for
one circuit moved and for every circuit moved at once, in one call (PUT /ocs/circuits), on the
paper rack, on a generated 64-GPU rack, and on a generated 512-GPU rack whose OCS has 1,024
ports (512 circuits changed at once). Racks of 256 GPUs or more are brought up bare by default
(emulation/bare.py: the same OVS bridges and controller path, no servers), since the full rack
takes minutes. Needs root (it brings racks up).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from controller.core.circuits import CircuitMap
from controller.core.rack import Rack, load_rack, parse_rack
from controller.core.rackgen import rack_spec
from emulation.harness import ROOT, Testbed

try:
    from scripts.stats import add_json_option, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, write_json


def _targets(rack: Rack) -> dict[str, CircuitMap]:
    """Circuit maps that move one GPU, and every GPU, to another downlink on its OCS (every GPU:
    the downlinks of each OCS rotated by half, so each GPU lands under another switch)."""
    start = CircuitMap.initial(rack)
    used = {p for c in start.circuits for p in c}
    free = [d.ocs_port for w in rack.spec.switches for d in w.downlinks if d.ocs_port not in used]
    port = rack.gpu_port(next(iter(rack.gpus)))
    spare = [f for f in free if f.device == port.device]
    other = next(d for w in rack.spec.switches for d in w.downlinks if d.ocs_port.device == port.device
                 and d.ocs_port != start.partner(port) and start.partner(d.ocs_port) is not None)
    one = [c for c in start.circuits if port not in c] + [(port, spare[0] if spare else other.ocs_port)]
    if not spare:  # every downlink is taken: swap with another GPU instead
        one = [c for c in one if other.ocs_port not in c or port in c]
        one.append((start.partner(other.ocs_port), start.partner(port)))
    moved = []
    for o in rack.ocs:
        gpus = sorted((g for g in rack.gpus if rack.gpu_port(g).device == o), key=lambda g: rack.gpu_port(g))
        downs = [d.ocs_port for w in rack.spec.switches for d in w.downlinks if d.ocs_port.device == o]
        half = len(downs) // 2
        moved += [(rack.gpu_port(g), downs[(i + half) % len(downs)]) for i, g in enumerate(gpus)]
    return {"one circuit": CircuitMap(one), "all circuits": CircuitMap(moved)}


def bench(rack: Rack, rack_file: Path, rounds: int, workdir: Path, bare: bool) -> list[dict]:
    rows = []
    t0 = time.monotonic()
    with Testbed(rack, rack_file, workdir, bare=bare) as tb:
        print(f"  {rack.name}: {len(rack.gpus)} GPUs{' (bare)' if bare else ''} up and synchronised in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
        start = CircuitMap.initial(rack)
        for kind, target in _targets(rack).items():
            overheads, totals, rest, phases = [], [], [], []
            tb.client.put("/ocs/circuits", {"circuits": target.to_json()})  # warm-up, not counted
            tb.client.put("/ocs/circuits", {"circuits": start.to_json()})
            for _ in range(rounds):
                for t in (target, start):  # both ways change the same number of circuits
                    c0 = time.perf_counter()
                    ev = tb.client.put("/ocs/circuits", {"circuits": t.to_json()})["event"]
                    rest.append(time.perf_counter() - c0)
                    totals.append(ev["total_s"])
                    overheads.append(ev["overhead_s"])
                    phases.append(
                        (
                            ev["dark_start"] - ev["requested_at"],
                            ev["dark_end"] - ev["dark_start"],
                            ev["ocs_confirmed_at"] - ev["dark_end"],
                            ev["flows_confirmed_at"] - ev["ocs_confirmed_at"],
                        )
                    )
            row = {
                "rack": rack.name,
                "gpus": len(rack.gpus),
                "ports": rack.spec.ocs[0].ports,
                "change": kind,
                "circuits": len(start.diff(target).add),
                "switching_ms": 1000 * ev["switching_time_s"],
                "min_ms": 1000 * min(overheads),
                "median_ms": 1000 * statistics.median(overheads),
                "max_ms": 1000 * max(overheads),
                "total_ms_median": 1000 * statistics.median(totals),
                "rest_roundtrip_ms_median": 1000 * statistics.median(rest),
                "rounds": len(overheads),
                "bare": bare,
                # medians of: old circuits gone, dark window, until the OCS app confirmed, then the switches
                "phases_ms": {
                    k: round(1000 * statistics.median(p[i] for p in phases), 1)
                    for i, k in enumerate(("teardown", "dark", "ocs_confirmed", "flows_after_ocs"))
                },
            }
            rows.append(row)
            print(
                f"    {kind}: {row['circuits']} circuits, overhead median {row['median_ms']:.1f} ms "
                f"(phases, ms: {row['phases_ms']})",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="reconfigurations per case, each way (default %(default)s)")
    p.add_argument(
        "--gpus",
        default="6,64,512",
        help="racks: 6 is the paper rack, others are generated with 8 aggregator switches (from 256 GPUs "
        "one downlink per GPU: 512 GPUs make a 1,024-port OCS) (default %(default)s)",
    )
    p.add_argument(
        "--bare-from",
        type=int,
        default=256,
        metavar="GPUS",
        help="bring racks of this many GPUs or more up bare (default %(default)s)",
    )
    add_json_option(p)
    args = p.parse_args(argv)
    try:
        sizes = [int(x) for x in args.gpus.split(",")]
    except ValueError:
        p.error("--gpus takes comma-separated integers, e.g. 6,64,512")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        print("reconfiguration overhead (start -> flows confirmed, minus the MEMS switching time)", flush=True)
        for n in sizes:
            if n == 6:
                path = ROOT / "topologies" / "paper-testbed.yaml"
                rack = load_rack(path)
            else:
                path = Path(tmp) / f"gen{n}.yaml"
                big = n >= 256  # 512 GPUs: 512 downlinks, a 1,024-port OCS
                path.write_text(
                    yaml.safe_dump(
                        rack_spec(n, gpus_per_server=8 if big else 4, switches=8, spare=1 if big else 2, name=f"gen{n}")
                    )
                )
                rack = parse_rack(yaml.safe_load(path.read_text()), str(path))
            rows += bench(rack, path, args.rounds, Path(tmp) / rack.name, bare=n >= args.bare_from)
    print(
        f"\n{'rack':8s} {'GPUs':>5s} {'ports':>5s} {'change':13s} {'circuits':>8s} {'switching':>10s} {'total':>9s} "
        f"{'overhead min':>12s} {'median':>8s} {'max':>8s} {'REST rtt':>9s}"
    )
    for r in rows:
        print(
            f"{r['rack']:8s} {r['gpus']:5d} {r['ports']:5d} {r['change']:13s} {r['circuits']:8d} "
            f"{r['switching_ms']:8.1f}ms {r['total_ms_median']:7.1f}ms {r['min_ms']:10.1f}ms {r['median_ms']:6.1f}ms "
            f"{r['max_ms']:6.1f}ms {r['rest_roundtrip_ms_median']:7.1f}ms"
        )
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

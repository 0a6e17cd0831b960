#!/usr/bin/env python3
"""Benchmark: control-plane overhead of a reconfiguration on the emulated rack.

Overhead = time from the REST call until the switches confirmed the new forwarding, minus the
modelled MEMS switching time. Measured for one circuit moved and for every circuit moved at
once, on the paper rack and on a generated 64-GPU rack. Needs root (it brings racks up).
"""
from __future__ import annotations

import argparse
import random
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
    from scripts.stats import add_json_option, show, spread, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, show, spread, write_json


def _targets(rack: Rack, rng: random.Random) -> dict[str, CircuitMap]:
    """Circuit maps that move one GPU, and all GPUs, to other free downlinks."""
    start = CircuitMap.initial(rack)
    used = {p for c in start.circuits for p in c}
    free = [d.ocs_port for w in rack.spec.switches for d in w.downlinks if d.ocs_port not in used]
    gpu = sorted(rack.gpus)[0]
    port = rack.gpu_port(gpu)
    one = [c for c in start.circuits if port not in c] + [(port, next(f for f in free if f.device == port.device))]
    downlinks = [d.ocs_port for w in rack.spec.switches for d in w.downlinks]
    allmoved = []
    for g in sorted(rack.gpus):
        p = rack.gpu_port(g)
        old = start.partner(p)
        choices = [d for d in downlinks if d.device == p.device and d != old and d not in {b for _, b in allmoved}]
        allmoved.append((p, rng.choice(choices)))
    return {"one circuit": CircuitMap(one), "all circuits": CircuitMap(allmoved)}


def bench(rack: Rack, rack_file: Path, rounds: int, workdir: Path) -> list[dict]:
    rng = random.Random(1)
    rows = []
    t0 = time.monotonic()
    with Testbed(rack, rack_file, workdir) as tb:
        print(f"  {rack.name}: {len(rack.gpus)} GPUs up and synchronised in {time.monotonic() - t0:.1f} s", flush=True)
        start = CircuitMap.initial(rack)
        for kind, target in _targets(rack, rng).items():
            overheads, totals, rest = [], [], []
            for _ in range(rounds):
                for t in (target, start):
                    c0 = time.perf_counter()
                    ev = tb.client.put("/ocs/circuits", {"circuits": t.to_json()})["event"]
                    rest.append(time.perf_counter() - c0)
                    if t is target:
                        totals.append(ev["total_s"])
                        overheads.append(ev["overhead_s"])
            rows.append({"rack": rack.name, "gpus": len(rack.gpus), "change": kind,
                         "circuits_changed": len(start.diff(target).add), "switching_ms": 1000 * ev["switching_time_s"],
                         "total_ms": spread(totals, 1000), "overhead_ms": spread(overheads, 1000),
                         "overhead_ms_p90": 1000 * sorted(overheads)[int(0.9 * (len(overheads) - 1))],
                         "rest_roundtrip_ms": spread(rest, 1000), "rounds": rounds})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="reconfigurations per case (default %(default)s)")
    p.add_argument("--gpus", type=int, default=64, help="size of the generated rack (default %(default)s)")
    add_json_option(p)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "generated.yaml"
        big.write_text(yaml.safe_dump(rack_spec(args.gpus, gpus_per_server=4, switches=8, spare=2, name=f"gen{args.gpus}")))
        paper = ROOT / "topologies" / "paper-testbed.yaml"
        print("reconfiguration overhead (REST call -> flows confirmed, minus the MEMS switching time)", flush=True)
        for rack, path in ((load_rack(paper), paper), (parse_rack(yaml.safe_load(big.read_text()), str(big)), big)):
            rows += bench(rack, path, args.rounds, Path(tmp) / rack.name)
    print(f"\nmedian (min–max) over {args.rounds} reconfigurations each, in ms")
    print(f"{'rack':8s} {'GPUs':>5s} {'change':13s} {'circuits':>8s} {'switching':>9s} {'total':>20s} "
          f"{'overhead':>20s} {'REST rtt':>20s}")
    for r in rows:
        print(f"{r['rack']:8s} {r['gpus']:5d} {r['change']:13s} {r['circuits_changed']:8d} {r['switching_ms']:9.1f} "
              f"{show(r['total_ms']):>20s} {show(r['overhead_ms']):>20s} {show(r['rest_roundtrip_ms']):>20s}")
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

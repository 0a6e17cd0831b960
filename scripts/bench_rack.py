#!/usr/bin/env python3
"""Benchmark: what bringing the emulated rack up and down costs, and the images it runs.

Prints the worker and NIC helper images' sizes on this host's engine, then brings the rack up
(`optirack-rack up`) and down (`optirack-rack down`) --rounds times, timing each command end to end.
With --cold the first round starts from `optirack-rack down --purge` (no image in any engine's
store, none in the registry): that round pushes the worker to the registry and every engine pulls
both images; it is reported apart. Run it as root, alone, with no rack up (it exits 2 if one is);
it leaves no rack up, pass or fail.

    flock /tmp/optirack-rack.lock python scripts/bench_rack.py --cold --json results/bench/NAME-bench_rack.json
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    from scripts.stats import add_json_option, show, spread, write_json
except ModuleNotFoundError:  # run as a file: scripts/ itself is on sys.path
    from stats import add_json_option, show, spread, write_json

RACK_CLI = [sys.executable, "-m", "emulation.cli"]


def image_bytes(image: str) -> int | None:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", image],
                         capture_output=True, text=True)
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else None


def timed(args: list[str], topo: str) -> float:
    """Seconds the rack CLI took; its output is shown; a failure ends the benchmark (exit 1)."""
    t0 = time.perf_counter()
    r = subprocess.run([*RACK_CLI, *args, *(["--topo", topo] if args[0] == "up" else [])], cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"optirack-rack {' '.join(args)} exited with {r.returncode}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from controller.core.rack import load_rack
    from emulation.rack import RackState

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="warm rack-ups and rack-downs timed (default %(default)s)")
    p.add_argument("--cold", action="store_true", help="first, one rack-up from empty image stores (see above)")
    p.add_argument("--topo", default=str(ROOT / "topologies" / "paper-testbed.yaml"))
    add_json_option(p)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if RackState.load() is not None:
        print("bench_rack: a rack is up; bring it down first (optirack-rack down)", file=sys.stderr)
        return 2
    rack = load_rack(args.topo)
    images = {"worker": f"optirack-worker:{os.environ.get('OPTIRACK_IMAGE_TAG', 'latest')}",  # the controller's default
              "nic_helper": rack.spec.engines.helper_image}
    sizes = {k: image_bytes(v) for k, v in images.items()}
    for k, v in images.items():
        print(f"{k:10s} {v:28s} {f'{sizes[k] / 1e6:.0f} MB' if sizes[k] else 'not on this engine (make image)'}")
    result = {"rack": rack.name, "images": images, "image_bytes": sizes, "cold_up_s": None}
    ups, downs = [], []
    try:
        if args.cold:
            print("cold: optirack-rack down --purge, then up (push and pulls)", flush=True)
            timed(["down", "--purge"], args.topo)
            result["cold_up_s"] = round(timed(["up"], args.topo), 2)
            downs.append(timed(["down"], args.topo))
        for i in range(args.rounds):
            print(f"round {i + 1}/{args.rounds}: up, down", flush=True)
            ups.append(timed(["up"], args.topo))
            downs.append(timed(["down"], args.topo))
    except (RuntimeError, KeyboardInterrupt) as e:
        print(f"bench_rack: {e or 'interrupted'}; taking the rack down", file=sys.stderr)
        subprocess.run([*RACK_CLI, "down"], cwd=ROOT)
        return 1
    result |= {"up_s": spread(ups, digits=2), "down_s": spread(downs, digits=2)}
    if result["cold_up_s"] is not None:
        print(f"cold rack-up: {result['cold_up_s']:.1f} s")
    print(f"rack-up (cached images): {show(result['up_s'], 's')}; rack-down: {show(result['down_s'], 's')}")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: where a crossing flow's bytes per 0.5 s window can be read, against the uplink's line rate.

Two steady iperf3 flows (the rack's flow settings: on the lossless fabric each window locked) cross
one uplink from two NICs under one aggregator switch to two NICs under the other. Every `--interval`
seconds the benchmark reads, for the uplink port, the bytes of the per-address OpenFlow rules toward
it (`ovs-ofctl dump-flows`) and the bytes of its per-address htb leaves (`tc -s class show`), and
prints, per window, each source's sum over the flows as a share of the line rate. A port that
carries two backlogged flows sends at its line rate, so a faithful counter sums to about 1 in every
window; the demo's share check reads the one that does (emulation/shares.py). Needs root and the
lossless fabric (the fair uplink's leaves).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from controller.core.emulated import netns_of, port_intf
from controller.core.rack import load_rack
from emulation import shares as sharecheck
from emulation.harness import ROOT, Testbed

try:
    from scripts.stats import add_json_option, show, spread, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, show, spread, write_json

RACK = ROOT / "topologies" / "paper-testbed.yaml"


def crossing_pairs(rack, uplink) -> list[tuple[str, str]]:
    """Two (sender, receiver) GPU pairs, each sender on a server apart from its receiver, the senders under
    the uplink's switch and the receivers under its peer (the rack file's circuits)."""
    from evidence.uplink import gpu_switches

    under = gpu_switches(rack.spec.model_dump(mode="json"))
    here = [g for g, w in under.items() if w == uplink[0]]
    there = [g for g, w in under.items() if w == uplink[1]]
    pairs = []
    for src in here:
        for dst in there:
            if rack.server_of[src] != rack.server_of[dst] and all(dst != d and src != s for s, d in pairs):
                pairs.append((src, dst))
                break
    if len(pairs) < 2:
        raise SystemExit(f"error: {rack.source}: fewer than two crossing pairs from {uplink[0]} to {uplink[1]}")
    return pairs[:2]


def measure(tb: Testbed, seconds: float, interval: float) -> dict:
    rack = tb.rack
    switch = next(w for w in rack.spec.switches if w.uplinks)
    up = switch.uplinks[0]
    peer = up.peer.device
    pairs = crossing_pairs(rack, (switch.name, peer))
    link, dev = f"{switch.name}:{up.port}", port_intf(switch.name, up.port)
    leaves = {link: sharecheck.leaf_addresses(dev)}
    if not leaves[link]:
        raise SystemExit(f"error: {dev} has no per-address leaves: run on the lossless fabric")
    cap = rack.spec.emulation.mbps(up.rate_gbps) * 1e6 / 8
    servers, clients = [], []
    try:
        for i, (_, dst) in enumerate(pairs):
            ip_dst = rack.addresses[dst][0]
            servers.append(subprocess.Popen(["ip", "netns", "exec", netns_of(rack.server_of[dst]), "iperf3", "-s",
                                             "-1", "-B", ip_dst, "-p", str(5401 + i)], stdout=subprocess.DEVNULL))
        time.sleep(1)
        for i, (src, dst) in enumerate(pairs):
            clients.append(subprocess.Popen(["ip", "netns", "exec", netns_of(rack.server_of[src]), "iperf3", "-c",
                                             rack.addresses[dst][0], "-B", rack.addresses[src][0], "-p",
                                             str(5401 + i), "-t", str(seconds + 3)], stdout=subprocess.DEVNULL))
        time.sleep(2)  # past the flows' start
        rows = []
        end = time.time() + seconds
        while time.time() < end:
            t = time.time()
            rules = sharecheck.uplink_rule_bytes({switch.name: {up.port}})
            sent, _ = sharecheck.uplink_leaves({link: dev}, leaves)
            rows.append((t, rules, sent))
            time.sleep(interval)
    finally:
        for p in clients + servers:
            if p.poll() is None:
                p.kill()
            p.wait(5)
    rule_sums, leaf_sums = [], []
    dsts = {f"{link} {rack.addresses[d][0]}" for _, d in pairs}
    for (t0, r0, l0), (t1, r1, l1) in zip(rows, rows[1:], strict=False):
        window = cap * (t1 - t0)
        rule_sums.append(sum(r1.get(k, 0) - r0.get(k, 0) for k in dsts) / window)
        leaf_sums.append(sum(l1.get(k, 0) - l0.get(k, 0) for k in dsts) / window)
    return {"uplink": link, "pairs": pairs, "interval_s": interval, "windows": len(rule_sums),
            "rules_share_of_line": spread(rule_sums), "leaves_share_of_line": spread(leaf_sums)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rack", type=Path, default=RACK, help=f"rack file (default {RACK.relative_to(ROOT)})")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to sample (default 10)")
    ap.add_argument("--interval", type=float, default=0.5, help="window, seconds (default 0.5: the demo's)")
    add_json_option(ap)
    args = ap.parse_args(argv)
    if args.seconds < 2 * args.interval or args.interval <= 0:
        ap.error("--seconds must cover at least two windows of --interval > 0")
    rack = load_rack(args.rack)
    with Testbed(rack, args.rack, Path(tempfile.mkdtemp(prefix="optirack-uplink-"))) as tb:
        out = measure(tb, args.seconds, args.interval)
    print(f"{out['windows']} windows of {args.interval:g} s on {out['uplink']}, two flows "
          f"{' and '.join('->'.join(p) for p in out['pairs'])}; bytes per window over the line rate's:")
    print(f"  per-address OpenFlow rules: {show(out['rules_share_of_line'], digits=2)}")
    print(f"  per-address htb leaves:     {show(out['leaves_share_of_line'], digits=2)}")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

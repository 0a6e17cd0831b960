#!/usr/bin/env python3
"""Benchmark: what the in-network aggregator's own software costs per chunk (optirack-aggregator, on loopback).

The aggregator runs as its own process (python -m containers.aggregator) and --ranks worker clients
(containers/aggclient.py, one process each) sum the rack's gradient through it with the rack's pool (the chunk
that fills one frame of the rack's MTU and its slots, as the controller reserves them), --rounds all-reduces in
each of --batches batches. The aggregator's CPU time over a batch (its process's time on a CPU, from
/proc/PID/schedstat, or /proc/PID/stat's ticks where that is missing) divided by the chunks it took in (ranks x
chunks x rounds) is its software cost per rank's chunk: taking one DATA datagram in, adding it to the slot, and
its share of the slot's RESULT datagrams out. Loopback has no line rate, so nothing but software sets the pace;
the workers' CPU is not counted: the median over the batches is the aggregator's software cost per chunk, the
figure a model of the aggregate path on the emulated rack takes. For a record, run it with nothing else running:

    python -m scripts.bench_aggregator --json results/bench/<UTC>-<commit>-bench_aggregator.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    from scripts.stats import add_json_option, spread, write_json
except ModuleNotFoundError:  # run as a file: scripts/ itself is on sys.path
    from stats import add_json_option, spread, write_json


def cpu_seconds(pid: int) -> float:
    """Seconds process `pid` has run on a CPU (its main thread: the aggregator is one)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (FileNotFoundError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_chunk(cpu_s: float, ranks: int, chunks: int, rounds: int) -> float:
    """The aggregator's CPU seconds per rank's chunk taken in."""
    if min(ranks, chunks, rounds) < 1:
        raise ValueError("at least one rank, chunk and round")
    return cpu_s / (ranks * chunks * rounds)


def _rank(address, key, rank, ranks, slots, chunk, elements, batches, rounds, start, done, out) -> None:
    import numpy as np

    from containers.aggclient import AggClient

    client = AggClient(address, key, rank, ranks, slots=slots, chunk=chunk, bind=("127.0.0.1", 0), timeout=60.0)
    client.join()
    values = np.arange(elements, dtype=np.float32) % 7 + rank
    times = []
    for _ in range(batches):
        start.wait()
        for _ in range(rounds):
            buf = values.copy()
            t = time.perf_counter()
            client.all_reduce(buf)
            times.append(time.perf_counter() - t)
        done.wait()
    expect = (np.arange(elements, dtype=np.float64) % 7) * ranks + ranks * (ranks - 1) / 2
    out.put({"rank": rank, "times": times, "exact": bool(np.array_equal(buf, expect.astype(np.float32))),
             **client.stats})
    client.leave()
    client.close()


def main(argv: list[str] | None = None) -> int:
    from containers import aggproto
    from controller.core.rack import load_rack
    from profiles import WORKLOADS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topo", type=Path, default=ROOT / "topologies" / "paper-testbed.yaml")
    p.add_argument("--model", choices=sorted(WORKLOADS), default="vgg16",
                   help="whose gradient, scaled as the emulated rack scales it (default %(default)s)")
    p.add_argument("--ranks", type=int, default=4, help="workers (default %(default)s)")
    p.add_argument("--rounds", type=int, default=20, help="all-reduces per batch (default %(default)s)")
    p.add_argument("--batches", type=int, default=5, help="batches, each measured apart (default %(default)s)")
    add_json_option(p)
    args = p.parse_args(argv)
    if args.ranks < 1 or args.rounds < 1 or args.batches < 1:
        p.error("--ranks, --rounds and --batches must be at least 1")
    rack = load_rack(args.topo)
    em = rack.spec.emulation
    slots, chunk = aggproto.shape_for_mtu(em.mtu)
    elements = max(1, round(WORKLOADS[args.model].gradient_bytes * em.rate_scale * em.time_dilation / aggproto.ITEM))
    chunks = -(-elements // chunk)
    agg = subprocess.Popen([sys.executable, "-m", "containers.aggregator", "--listen", "127.0.0.1:0",
                            "--capacity-bytes", str(64 << 20)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    ranks: list[mp.Process] = []
    try:
        line = json.loads(agg.stdout.readline())
        address = (line["address"][0], line["address"][1])
        ctx = mp.get_context("spawn")
        start, done, out = ctx.Barrier(args.ranks + 1), ctx.Barrier(args.ranks + 1), ctx.Queue()
        ranks = [ctx.Process(target=_rank, args=(address, 7, r, args.ranks, slots, chunk, elements, args.batches,
                                                  args.rounds, start, done, out)) for r in range(args.ranks)]
        for proc in ranks:
            proc.start()
        costs = []
        for b in range(args.batches):
            start.wait(timeout=120)  # every rank joined (and the previous batch is over)
            before = cpu_seconds(agg.pid)
            done.wait(timeout=600)
            cost = per_chunk(cpu_seconds(agg.pid) - before, args.ranks, chunks, args.rounds)
            costs.append(cost)
            print(f"  batch {b + 1}/{args.batches}: {1e6 * cost:.1f} us of the aggregator's CPU per rank's chunk",
                  flush=True)
        results = sorted((out.get(timeout=60) for _ in ranks), key=lambda r: r["rank"])
        for proc in ranks:
            proc.join(timeout=30)
    finally:
        for proc in ranks:
            if proc.is_alive():
                proc.kill()
        agg.terminate()
        tail = agg.communicate(timeout=10)[0].strip().splitlines()
    stopped = json.loads(tail[-1]) if tail else {}
    times = [max(r["times"][i] for r in results) for i in range(args.batches * args.rounds)]
    s = spread(costs, 1e6, 2)
    print(f"{args.model} on {rack.name}'s pool ({slots} slots of {chunk} elements, {chunks} chunks a rank): the "
          f"aggregator's CPU per rank's chunk {s['median']} us (median of {args.batches} batches, "
          f"{s['min']}-{s['max']}); all-reduce on loopback {1e3 * statistics.median(times):.1f} ms (median); "
          f"sums exact: {all(r['exact'] for r in results)}; resent {sum(r['resent'] for r in results)}")
    write_json(args.json, {"rack": rack.name, "model": args.model, "ranks": args.ranks, "slots": slots,
                           "chunk": chunk, "elements": elements, "chunks": chunks, "rounds": args.rounds,
                           "batches": args.batches, "cpu_per_rank_chunk_us": s,
                           "all_reduce_ms": spread(times, 1e3, 2), "exact_sums": all(r["exact"] for r in results),
                           "clients": [{k: v for k, v in r.items() if k != "times"} for r in results],
                           "aggregator": stopped})
    return 0


if __name__ == "__main__":
    sys.exit(main())

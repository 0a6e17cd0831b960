#!/usr/bin/env python3
"""Benchmark: the fixed software cost of a ring all-reduce step, measured on loopback.

The simulator's network model for the emulation charges every ring step a fixed cost besides its bytes
(simulator/model/calibration.py, STEP_S), measured on the emulated fabric at the paper cases' gradient by
scripts/bench_allreduce.py. This measures the software's part of it, without the fabric: N worker ranks
(optirack-worker, the same program the containers run, gloo's point-to-point with our ring) on 127.0.0.1,
all-reducing a tiny tensor (so its bytes cost nothing) with no compute phase, for --iterations iterations,
--rounds times. It prints the median all-reduce time and the time per step (an all-reduce of N ranks is 2(N-1)
steps), each as median (min-max) over the rounds, beside the constant the model uses. Runs as any user; sends
traffic on loopback only. Figures depend on the host's load: run it with nothing else busy.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from scripts.stats import add_json_option, show, spread, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, show, spread, write_json

WORKER = Path(sys.executable).parent / "optirack-worker"
WARMUP = 5  # first iterations left out: connection set-up and first-touch costs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(ranks: int, iterations: int, gradient_bytes: int, timeout: float) -> list[float]:
    """Rank 0's all-reduce times (s) of one run of `ranks` workers on loopback, warm-up left out."""
    port = _free_port()
    base = [str(WORKER), "--world-size", str(ranks), "--master", "127.0.0.1", "--master-port", str(port),
            "--ifname", "lo", "--iterations", str(iterations + WARMUP), "--gradient-bytes", str(gradient_bytes),
            "--compute-seconds", "0", "--backend", "gloo", "--allreduce", "ring"]
    with tempfile.TemporaryDirectory(prefix="optirack-loopback-") as tmp:
        outs = [Path(tmp) / f"rank{r}.out" for r in range(ranks)]
        procs = []
        try:
            for r in range(ranks):
                with outs[r].open("w") as f:
                    procs.append(subprocess.Popen([*base, "--rank", str(r)], stdout=f, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL))
            for r, p in enumerate(procs):
                if p.wait(timeout=timeout) != 0:
                    raise SystemExit(f"bench_loopback: rank {r} exited {p.returncode}:\n{outs[r].read_text()[-2000:]}")
        finally:
            for p in procs:  # only ours, and only if still running (a timeout or an error above)
                if p.poll() is None:
                    p.kill()
                    p.wait()
        lines = [json.loads(x) for x in outs[0].read_text().splitlines() if x.startswith("{")]
    comm = [x["comm_s"] for x in lines if x.get("event") == "iteration" and x["iteration"] >= WARMUP]
    if len(comm) != iterations:
        raise SystemExit(f"bench_loopback: rank 0 reported {len(comm)} of {iterations} iterations")
    return comm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4, help="ranks in the ring (default %(default)s, the paper's job)")
    p.add_argument("--iterations", type=int, default=40, help="measured iterations per round (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="runs of the ring (default %(default)s)")
    p.add_argument("--gradient-bytes", type=int, default=4096,
                   help="bytes all-reduced per iteration (default %(default)s: small enough to cost nothing)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a round may take (default %(default)s)")
    add_json_option(p)
    args = p.parse_args(argv)
    for name in ("ranks", "iterations", "rounds", "gradient_bytes"):
        if getattr(args, name) < (2 if name == "ranks" else 1):
            p.error(f"--{name.replace('_', '-')} must be at least {2 if name == 'ranks' else 1}")
    if not WORKER.exists():
        p.error(f"no worker at {WORKER}: run make setup, and this script with the virtualenv's python")
    steps = 2 * (args.ranks - 1)
    medians = []
    for r in range(args.rounds):
        comm = one_round(args.ranks, args.iterations, args.gradient_bytes, args.timeout)
        medians.append(statistics.median(comm))
        print(f"round {r + 1}/{args.rounds}: median all-reduce {1000 * medians[-1]:.2f} ms "
              f"over {len(comm)} iterations", file=sys.stderr)
    per_allreduce = spread(medians, 1000)
    per_step = spread([m / steps for m in medians], 1000)
    from simulator.model.calibration import STEP_S

    print(f"ring of {args.ranks} on loopback, {args.gradient_bytes} B, {args.rounds} rounds "
          f"of {args.iterations} iterations (median over each round; median (min–max) over the rounds):")
    print(f"  all-reduce: {show(per_allreduce, 'ms', 2)}")
    print(f"  per step ({steps} steps): {show(per_step, 'ms', 2)}; "
          f"the simulator's model charges {1000 * STEP_S:.2f} ms per step beyond the bytes, measured on the emulated "
          "fabric at the paper cases' gradient (scripts/bench_allreduce.py)")
    write_json(args.json, {"ranks": args.ranks, "gradient_bytes": args.gradient_bytes, "steps": steps,
                           "allreduce_ms": per_allreduce, "step_ms": per_step,
                           "model_step_ms": round(1000 * STEP_S, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The older name of the simulator's model, and the list of the model's modules.

The model's identity is its fingerprint (evidence/fingerprint.py; simulator/identity.py reads the committed one).
Before fingerprints, a record named its model by `model_hash`: a hash over the files in MODEL_FILES, each without
comments, docstrings and blank lines (`model_hash`). Records keep it and new ones still carry it, readable beside the
fingerprint; it decides nothing now (a refactor changed it though no prediction moved). MODEL_FILES also names the
model's modules, which the probe set must each run (tests/unit/test_fingerprint.py, under a tracer), with MORE_MODEL
(the neighbours' fabrics and the generated racks the probes run too).
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import subprocess
import tokenize
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODEL_FILES = (
    # the controller's own placement, routes and admission that the simulator runs (controller/core): a change of
    # how the controller places a job changes what the simulator predicts
    "controller/core/admission.py",  # which queued job is admitted next (fifo, backfill, ...)
    "controller/core/cabling.py",  # which OCS ports a circuit may join
    "controller/core/circuits.py",  # the circuit map and its diffs (the circuits a placement changes)
    "controller/core/defrag.py",  # the joint regrouping of running jobs (defrag)
    "controller/core/forwarding.py",  # the routes between GPUs (which links a ring crosses)
    "controller/core/occupancy.py",  # which GPUs and downlinks are free
    "controller/core/placement.py",  # fixed and regroup placement
    "controller/core/pools.py",  # GPU pools by model
    "controller/core/rack.py",  # the rack file as the controller reads it
    "controller/core/rackspec.py",  # the rack file's fields
    "controller/core/spares.py",  # which spare GPUs a recovery takes (the controller's rule, run by the simulator)
    "profiles/__init__.py",  # compute time and gradient bytes of each GPU model and workload
    "simulator/model/adapter.py",  # which GPUs and circuits a policy gives a job (through controller.core)
    "simulator/model/calibration.py",  # the calibration constants: loopback step, efficiency, sharing
    "simulator/inputs/cases.py",  # the paper's two cases: which GPUs each job holds
    "simulator/model/columns.py",  # a ring's state within its iteration, per ring and as arrays (large components)
    "simulator/model/detail.py",  # event-by-event rings on shared links
    "simulator/model/engine.py",  # the cluster run: arrivals, placement, iterations
    "simulator/model/failures.py",  # server failures the engine draws (none in the paper's cases)
    "simulator/model/fidelity.py",  # how a recorded point is simulated (its rack, start offsets)
    "simulator/model/interference.py",  # rings that share links: steady state
    "simulator/model/lags.py",  # the emulation's container start and end, GPU release, per-iteration lags
    "simulator/model/maxmin.py",  # max-min fair rates
    "simulator/model/meanfield.py",  # large components: the mean-field fixed point
    "simulator/model/models.py",  # transformer workloads
    "simulator/model/network.py",  # link rates, efficiency, step latency, sharing
    "simulator/model/rings.py",  # a ring's closed-form iteration
    "simulator/model/timeshift.py",  # delaying a ring's first iteration
    "simulator/model/tracesim.py",  # how the trace check simulates a replayed trace (policies, lags, calibration)
    "simulator/inputs/workloads.py",  # the paper's jobs as simulated jobs
)


# modules the probe set runs besides MODEL_FILES (not in the old hash, so that it stays what records carry)
MORE_MODEL = (
    "controller/core/placing.py",  # placing a pool's GPUs under switches step by step (split from pools.py)
    "controller/core/rackgen.py",  # generated racks of any size
    "controller/core/rackindex.py",  # the rack's integer ids of ports, GPUs, switches (split from occupancy.py)
    "simulator/model/busy.py",  # GPU-seconds computed (split from interference.py)
    "simulator/model/eventkinds.py",  # the kinds of a run's events (split from engine.py)
    "simulator/model/neighbours.py",  # the neighbours' fabrics and collectives
    "simulator/inputs/racks.py",  # the simulated rack: a rack file, or a generated one
    "simulator/model/results.py",  # what a run predicts, per job and per run (split from engine.py)
    "simulator/model/run_failures.py",  # a run's server failures and recoveries (split from engine.py)
    "simulator/model/run_moves.py",  # a run's defragmentation rounds and moves (split from engine.py)
    "simulator/model/runspec.py",  # a run's policy and options (split from engine.py)
    "simulator/model/schedview.py",  # a run as the admission policies see it (split from engine.py)
    "simulator/model/sharing.py",  # MLTCP's shares (the neighbours' mltcp policy)
)


def normalise(source: str) -> str:
    """`source` without its comments, docstrings, blank lines and trailing spaces (the same text whatever the
    Python version: the spans to drop come from the tokenizer's comments and the parser's docstring nodes)."""
    lines = source.splitlines()
    drop: list[tuple[int, int, int, int]] = []  # (start line, start col, end line, end col), lines from 1
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            drop.append((*tok.start, *tok.end))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                drop.append((first.lineno, first.col_offset, first.end_lineno, first.end_col_offset))
    for l0, c0, l1, c1 in sorted(drop, reverse=True):  # from the end, so earlier positions stay valid
        if l0 == l1:
            lines[l0 - 1] = lines[l0 - 1][:c0] + lines[l0 - 1][c1:]
        else:
            lines[l0 - 1:l1] = [lines[l0 - 1][:c0] + lines[l1 - 1][c1:]]
    return "\n".join(line.rstrip() for line in lines if line.strip())


def model_hash(read: Callable[[str], str | None] | None = None) -> str:
    """sha256 (hex) over MODEL_FILES, each normalised; `read(path)` gives a file's text (default: this checkout),
    None for a file that is absent (it counts as absent: another model)."""
    read = read or _read_checkout
    h = hashlib.sha256()
    for path in MODEL_FILES:
        text = read(path)
        h.update(json.dumps([path, None if text is None else normalise(text)]).encode())
    return h.hexdigest()


def model_hash_at(commit: str, root: Path = ROOT) -> str | None:
    """The model hash of the files as they were at `commit` (git), or None where that cannot be known (no git,
    an unknown commit)."""
    try:
        subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"], check=True,
                       capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None

    def read(path: str) -> str | None:
        r = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{path}"], capture_output=True, text=True,
                           timeout=10)
        return r.stdout if r.returncode == 0 else None

    return model_hash(read)


def _read_checkout(path: str) -> str | None:
    try:
        return (ROOT / path).read_text()
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m evidence.modelhash",
                                description="Print the hash over the simulator's model files that records carry as "
                                            "model_hash (the model's identity is its fingerprint: python -m "
                                            "evidence.fingerprint).")
    p.add_argument("--files", action="store_true", help="also list the files it covers")
    p.add_argument("--at", metavar="COMMIT", help="the hash of the files as they were at a git commit")
    args = p.parse_args(argv)
    h = model_hash_at(args.at) if args.at else model_hash()
    if h is None:
        p.error(f"--at: {args.at!r} is not a commit of this repository")
    print(h)
    if args.files:
        print("\n".join(MODEL_FILES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

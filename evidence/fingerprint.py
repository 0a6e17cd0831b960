"""The model's fingerprint: which model made a prediction, known by what it predicts.

The fingerprint is sha256 over the probe set's outputs (evidence/probes.py: fixed, committed inputs, both demo cases
at their sweep points, the trace check's trace, a failure run, the neighbours, the 16,384-GPU paths), each output
hashed exactly as JSON writes it (a float's shortest round-trip form, nothing rounded). A change that leaves every
probe's output identical (a refactor, a split module, a reworded comment) keeps it; a change to any prediction
changes it.

- `current()`: the fingerprint of this checkout's model, computed (about 6 s; once per process).
- simulator/fingerprint.json: the fingerprint as of this commit (`--write` makes it), so that reading which records
  check the model costs nothing; tests/unit/test_fingerprint.py computes it and fails where the file is stale.
- `at(commit)`: the fingerprint of another commit's model, computed in a git worktree of that commit by this
  checkout's probe set (`python -m evidence.fingerprint --at COMMIT`), or why it cannot be (that commit's code
  cannot run the probes).
- `--records`: each committed `make demo` record's and trace replay's fingerprint, computed at the record's own
  commit, written beside it as <record>.fingerprint (a record made from a checkout with uncommitted changes, or
  whose commit cannot run the probes, gets the reason instead: its `model_hash`, the hash over the model's files it
  was made with, stays readable in the record). Records made after fingerprints existed carry `model_fingerprint`.

A record checks today's model only if its fingerprint equals today's (evidence/records.py `of_current_model`).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBES = Path(__file__).resolve().parent / "probes.py"
SIDECAR = ".fingerprint"  # evidence/records.py reads it
COMMAND = "python -m evidence.fingerprint --records"
RECORD_DIRS = ("results/records", "results/replay")


def digest(data) -> str:
    """sha256 (hex) of `data` as canonical JSON (sorted keys, no spaces; floats as Python writes them)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def of_outputs(outputs: dict) -> dict:
    """The fingerprint of the probes' outputs, and each probe's own hash (where two models differ)."""
    per = {name: digest(value) for name, value in sorted(outputs.items())}
    return {"fingerprint": digest(per), "probes": per}


def probe_set() -> str:
    """What the probe set is (its runner and its inputs), short: fingerprints are comparable under one probe set."""
    h = hashlib.sha256(PROBES.read_bytes())
    for path in sorted((PROBES.parent / "probe_inputs").iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


@cache
def computed() -> dict:
    """This checkout's model's fingerprint, computed by running the probe set in this process."""
    from evidence import probes

    return {**of_outputs(probes.run()), "probe_set": probe_set()}


def current() -> str:
    return computed()["fingerprint"]


def write() -> dict:
    """Compute this checkout's fingerprint and write it to simulator/fingerprint.json (simulator/identity.py)."""
    from simulator import identity

    out = computed()
    identity.FINGERPRINT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


# --- another commit's model -----------------------------------------------------------------------------------
def run_in(tree: Path, names: tuple[str, ...] = (), timeout_s: float = 600) -> dict:
    """The probe set (or the probes `names`) run on the model of `tree` (a checkout) in another process:
    {fingerprint, probes, probe_set}; RuntimeError with the last line of the error where that tree's code cannot
    run the probes."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    proc = subprocess.run([sys.executable, str(PROBES), "--json-with-files", *names], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"the probes exited {proc.returncode}")
    data = json.loads(proc.stdout)
    outside = [f for f in data["files"] if not Path(f).resolve().is_relative_to(tree.resolve())]
    if outside:
        raise RuntimeError(f"the probes imported the model from outside {tree}: {', '.join(outside)}")
    return {**of_outputs(data["outputs"]), "probe_set": probe_set()}


def git(*args: str, root: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
                          timeout=120).stdout.strip()


def at(commit: str, root: Path = ROOT) -> dict:
    """The fingerprint of the model at `commit`, computed in a temporary git worktree of it; ValueError for what
    is not a commit, RuntimeError where that commit's code cannot run the probes."""
    try:
        full = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", root=root)
    except subprocess.CalledProcessError:
        raise ValueError(f"{commit!r} is not a commit of this repository") from None
    with tempfile.TemporaryDirectory(prefix="optirack-fingerprint-") as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), full, root=root)
        try:
            return {**run_in(tree), "commit": full}
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                           capture_output=True, timeout=120)


# --- the records' fingerprints --------------------------------------------------------------------------------
def sidecar(record: Path) -> Path:
    return record.with_suffix(SIDECAR)


def record_commit(record: Path) -> tuple[str | None, str | None]:
    """(the commit a record's name gives, why it cannot be used): <UTC>-<commit>[-dirty].json."""
    parts = record.stem.split("-")
    if len(parts) < 2 or parts[1] == "nogit":
        return None, "made outside a git checkout: no commit to compute its model at"
    if parts[-1] == "dirty":
        return parts[1], (f"made from a checkout of {parts[1]} with uncommitted changes: the model that made it is "
                          "not that commit's, and cannot be known")
    return parts[1], None


def fingerprint_records(paths: list[Path], root: Path = ROOT, log=print) -> list[Path]:
    """For each record, its fingerprint computed at its own commit, written beside it; one worktree per commit."""
    by_commit: dict[str, list[Path]] = {}
    written = []
    for path in paths:
        commit, why = record_commit(path)
        if why:
            written.append(_write_sidecar(path, {"fingerprint": None, "commit": commit, "why": why}))
            log(f"{path.name}: {why}")
            continue
        by_commit.setdefault(commit, []).append(path)
    for commit, group in by_commit.items():
        try:
            result = at(commit, root)
            body = {"fingerprint": result["fingerprint"], "commit": result["commit"], "probes": result["probes"],
                    "probe_set": result["probe_set"]}
            log(f"{commit}: {result['fingerprint'][:12]} ({len(group)} records)")
        except ValueError:
            body = {"fingerprint": None, "commit": commit,
                    "why": f"its commit {commit} is not in this repository: its model cannot be run again"}
            log(f"{commit}: not a commit of this repository")
        except (RuntimeError, subprocess.SubprocessError) as e:
            body = {"fingerprint": None, "commit": commit,
                    "why": f"the probe set cannot run on this commit's code: {e}"}
            log(f"{commit}: cannot run the probes: {e}")
        for path in group:
            written.append(_write_sidecar(path, body))
    return written


def _write_sidecar(record: Path, body: dict) -> Path:
    out = sidecar(record)
    out.write_text(json.dumps({"record": record.name, **body, "command": COMMAND}, indent=1, sort_keys=True) + "\n")
    return out


def committed_records(root: Path = ROOT) -> list[Path]:
    """Every record git tracks under results/records and results/replay."""
    out = []
    for d in RECORD_DIRS:
        out += [root / f for f in git("ls-files", "--", f"{d}/*.json", root=root).splitlines() if "/" not in
                f[len(d) + 1:]]
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m evidence.fingerprint",
                                description="The model's fingerprint: a hash of its predictions on the probe set "
                                            "(evidence/probes.py).")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--at", metavar="COMMIT", help="the fingerprint of the model at a git commit (a worktree of it)")
    g.add_argument("--write", action="store_true", help="compute this checkout's and write simulator/fingerprint.json")
    g.add_argument("--records", nargs="*", type=Path, metavar="RECORD",
                   help="compute each record's at its own commit and write it beside the record as "
                        "<record>.fingerprint (no RECORD: every committed one under results/records and "
                        "results/replay)")
    p.add_argument("--probes", action="store_true", help="also print each probe's own hash")
    args = p.parse_args(argv)
    if args.records is not None:
        paths = args.records or committed_records()
        missing = [str(x) for x in paths if not x.is_file()]
        if missing:
            p.error(f"--records: no such record: {', '.join(missing)}")
        for path in fingerprint_records([x.resolve() for x in paths]):
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return 0
    try:
        out = at(args.at) if args.at else write() if args.write else computed()
    except ValueError as e:
        p.error(f"--at: {e}")
    except RuntimeError as e:
        print(f"python -m evidence.fingerprint: --at {args.at}: cannot run the probe set: {e}", file=sys.stderr)
        return 1
    print(out["fingerprint"])
    if args.probes:
        for name, h in out["probes"].items():
            print(f"{name} {h}")
    if args.write:
        print("wrote simulator/fingerprint.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

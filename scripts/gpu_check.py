"""The worker on a real GPU: what the emulated rack cannot check (it has no GPU).

Runs optirack-worker's ranks by hand on loopback on a machine with one CUDA GPU and checks:
  real        real mode on the GPU over NCCL: the model trains (finite losses), the start line names cuda and nccl,
              NVML answers for the utilization, checkpoints are written every K iterations;
  restore     a second run goes on from a checkpoint on this server's disk (`--restore-from local`) and one fetched
              over TCP from a worker's checkpoint server (`--restore-from 127.0.0.1`): each starts at that
              iteration and its losses match the uninterrupted run's for the same iterations (the weights and
              the optimizer's momentum came back);
  regroup     a rank told to regroup (the controller's command after a peer's loss: containers/worker.py) leaves its
              NCCL communicator and forms a new one in the same process, going on from the checkpoint in its memory
              with the uninterrupted run's losses (one GPU: a ring of one, the old communicator destroyed and a new
              one made; a ring that lost a peer on NCCL needs two GPUs);
  profile     profile mode keeps the GPU computing for the profile's compute time (NVML's median >= 30 %);
  two-on-one  two ranks on one GPU end with exit 4 and a line of ours saying so (NCCL refuses them).

  python -m scripts.gpu_check --json results/gpu/<stamp>.json     # exit 0: every check passed

Needs PyTorch with CUDA and a GPU; on a machine without one it says so and exits 2. Nothing outside the loopback
is touched; its files go to a temporary directory that is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(args: list[str], timeout: float = 300) -> tuple[int, list[dict], str]:
    """Run one rank; its exit code, its JSON lines and its stderr's tail."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    p = subprocess.run(
        [sys.executable, "-m", "containers.worker", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = []
    for line in p.stdout.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return p.returncode, lines, p.stderr[-2000:]


def events(lines: list[dict], name: str) -> list[dict]:
    return [e for e in lines if e.get("event") == name]


BACKEND = "nccl"  # --dry-run: gloo on the CPU, to try this script where there is no GPU


def one_rank(port: int, extra: list[str]) -> list[str]:
    return [
        "--rank",
        "0",
        "--world-size",
        "1",
        "--master",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--ifname",
        "lo",
        "--backend",
        BACKEND,
        *extra,
    ]


def regroup(results: dict, rank, n: int, k: int, tmp: Path, losses: dict[int, float]) -> None:
    """One rank in real mode; once it has saved a checkpoint, its regroup command for attempt 1 (as the controller
    hands it: a file in its control directory) on another port, going on from that checkpoint (in its memory)."""
    import math

    control, ck = tmp / "control", tmp / "ck-regroup"
    args = ["--mode", "real", "--iterations", str(n), "--checkpoint-dir", str(ck), "--checkpoint-every", str(k),
            "--checkpoint-port", "29661", "--control-dir", str(control)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "containers.worker", *rank(29660, args)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, told, deadline = [], None, time.monotonic() + 300
    assert p.stdout is not None
    for raw in p.stdout:
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        lines.append(line)
        if told is None and line.get("event") == "checkpoint":
            told = line["iteration"]
            argv = rank(29670, [*args, "--attempt", "1", "--resume-from", str(told)])
            control.mkdir(parents=True, exist_ok=True)
            (control / "regroup-1.json.tmp").write_text(json.dumps({"argv": argv}))
            (control / "regroup-1.json.tmp").rename(control / "regroup-1.json")
        if time.monotonic() > deadline:
            p.kill()
            break
    rc, err = p.wait(), (p.stderr.read() if p.stderr else "")[-300:]
    moved = events(lines, "regroup")
    restored = [e for e in events(lines, "restored") if e.get("attempt") == 1]
    after = {e["iteration"]: e["loss"] for e in events(lines, "iteration") if e.get("attempt") == 1}
    worst = max((abs(after[i] - losses[i]) / max(1e-9, abs(losses[i])) for i in after if i in losses), default=None)
    check(
        results,
        "regroup: a new NCCL communicator in the same process, from the checkpoint in memory",
        rc == 0 and told is not None and len(moved) == 1 and moved[0].get("pid") == p.pid
        and bool(restored) and restored[0].get("from") == "memory" and sorted(after) == list(range(told, n))
        and worst is not None and math.isfinite(worst) and worst < 1e-2,
        rc=rc, told_at=told, left_s=moved[0].get("leave_s") if moved else None,
        restored_from=restored[0].get("from") if restored else None, iterations_after=len(after),
        worst_relative_loss_difference=worst, stderr=err if rc else "",
    )


def check(results: dict, name: str, ok: bool, **facts) -> None:
    results["checks"].append({"check": name, "ok": bool(ok), **facts})
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {json.dumps(facts)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the record here")
    ap.add_argument("--iterations", type=int, default=24)
    ap.add_argument("--every", type=int, default=4, help="checkpoint every K iterations")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: run the same ranks with gloo on the CPU (the GPU-only checks then fail)",
    )
    a = ap.parse_args(argv)
    import torch

    global BACKEND
    BACKEND = "gloo" if a.dry_run else "nccl"
    if not torch.cuda.is_available() and not a.dry_run:
        print(
            "gpu_check: no CUDA GPU visible here (torch.cuda.is_available() is False); run it on a GPU machine",
            file=sys.stderr,
        )
        return 2
    results: dict = {
        "command": ["scripts/gpu_check.py", *(argv if argv is not None else sys.argv[1:])],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (dry run)",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
        "versions": {
            "optirack": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
            or "unknown"
        },
        "checks": [],
    }
    n, k = a.iterations, a.every
    with tempfile.TemporaryDirectory(prefix="optirack-gpu-check-") as tmp:
        ck = Path(tmp) / "ck"
        # real mode, uninterrupted
        def real(port: int, *extra: str) -> tuple[int, list[dict], str]:
            """Real mode on the GPU, this run's iterations, checkpoints in `ck`, its server on port + 1."""
            return worker(one_rank(port, ["--mode", "real", "--iterations", str(n), "--checkpoint-dir", str(ck),
                                          "--checkpoint-port", str(port + 1), *extra]))

        rc, lines, err = real(29610, "--checkpoint-every", str(k))
        start = (events(lines, "start") or [{}])[0]
        its = {e["iteration"]: e for e in events(lines, "iteration")}
        losses = [its[i]["loss"] for i in sorted(its)]
        saved = sorted(e["iteration"] for e in events(lines, "checkpoint"))
        check(
            results,
            "real: trains on the GPU over NCCL",
            rc == 0
            and start.get("device", "").startswith("cuda")
            and start.get("backend") == "nccl"
            and len(its) == n
            and bool(events(lines, "done")),
            rc=rc,
            device=start.get("device"),
            backend=start.get("backend"),
            iterations=len(its),
            stderr=err[-300:] if rc else "",
        )
        import math

        check(
            results,
            "real: every loss finite",
            bool(losses) and all(math.isfinite(x) for x in losses),
            first=losses[0] if losses else None,
            last=losses[-1] if losses else None,
        )
        check(
            results,
            "real: NVML reads the utilization",
            start.get("utilization") == "nvml",
            utilization=start.get("utilization"),
            median_gpu_util=sorted(e["gpu_util"] for e in its.values())[len(its) // 2] if its else None,
        )
        check(
            results,
            f"real: a checkpoint every {k} iterations",
            saved == list(range(k, n, k)),
            saved=saved,
            bytes=(events(lines, "checkpoint") or [{}])[0].get("bytes"),
        )
        results["real"] = {
            "iteration_s_median": sorted(e["iter_s"] for e in its.values())[len(its) // 2] if its else None,
            "losses": losses,
        }
        # restore: from this server's disk, then over TCP from a checkpoint server (this worker's own, on loopback)
        resume = saved[-1] if saved else k
        for source, port in (("local", 29620), ("127.0.0.1", 29630)):
            rc, lines, err = real(port, "--resume-from", str(resume), "--restore-from", source,
                                  "--restore-writer", "rank-0")
            start = (events(lines, "start") or [{}])[0]
            restored = (events(lines, "restored") or [{}])[0]
            again = {e["iteration"]: e["loss"] for e in events(lines, "iteration")}
            worst = max(
                (abs(again[i] - its[i]["loss"]) / max(1e-9, abs(its[i]["loss"])) for i in again if i in its),
                default=None,
            )
            check(
                results,
                f"restore from {source}: goes on from iteration {resume} with the same losses",
                rc == 0
                and start.get("start_iteration") == resume
                and sorted(again) == list(range(resume, n))
                and worst is not None
                and worst < 1e-2,
                rc=rc,
                start_iteration=start.get("start_iteration"),
                restore_s=restored.get("restore_s"),
                bytes=restored.get("bytes"),
                worst_relative_loss_difference=worst,
                stderr=err[-300:] if rc else "",
            )
        regroup(results, one_rank, n, k, Path(tmp), dict(enumerate(results["real"]["losses"])))
        # profile mode: the compute phase keeps the GPU busy (NVML averages over up to a second: run for about 3 s
        # and judge the last third, so the idle start-up is out of its window)
        rc, lines, err = worker(
            one_rank(29640, ["--mode", "profile", "--workload", "vgg16", "--gpu-model", "H100", "--iterations", "150"])
        )
        its = events(lines, "iteration")
        util = sorted(e.get("gpu_util", 0) for e in its[-len(its) // 3 :]) if len(its) > 3 else []
        comp = sorted(e.get("compute_s", 0) for e in its)
        check(
            results,
            "profile: the GPU computes for the profile's time",
            rc == 0 and len(its) == 150 and bool(util) and util[len(util) // 2] >= 0.3,
            rc=rc,
            median_gpu_util=util[len(util) // 2] if util else None,
            median_compute_s=comp[len(comp) // 2] if comp else None,
            stderr=err[-300:] if rc else "",
        )
        # two ranks on the one GPU
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "containers.worker",
                    "--rank",
                    str(r),
                    "--world-size",
                    "2",
                    "--master",
                    "127.0.0.1",
                    "--master-port",
                    "29650",
                    "--ifname",
                    "lo",
                    "--backend",
                    "nccl",
                    "--mode",
                    "real",
                    "--iterations",
                    "2",
                    "--timeout",
                    "60",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in (0, 1)
        ]
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            outs.append((p.returncode, err))
        codes = [c for c, _ in outs]
        said = [next((x for x in e.splitlines() if "optirack-worker:" in x), e.strip()[-200:]) for _, e in outs]
        check(
            results,
            "two ranks on one GPU: exit 4 with one line",
            4 in codes and any("one GPU per rank" in s for s in said),
            exit_codes=codes,
            lines=said,
        )
    results["passed"] = all(c["ok"] for c in results["checks"])
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    print("gpu_check:", "every check passed" if results["passed"] else "a check FAILED", flush=True)
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

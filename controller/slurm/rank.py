"""`optirack-slurm-rank`: one rank of a training job, started by `srun` on the GPU Slurm gave it.

srun starts one task per allocated GPU on the node Slurm chose, in that node's namespace. This
finds the task's GPU (its CUDA_VISIBLE_DEVICES when Slurm bound one GPU to it, else the node's
SLURM_LOCALID-th GPU of the job), the job's GPUs in a fixed order (node, then index: every task
computes the same), its rank among them, rank 0's NIC address as the rendezvous, and starts the
same worker `optirack submit` runs (containers/worker.py) bound to this GPU's NIC
(GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME through --ifname). Arguments after `--` go to the worker.

With `--checkpoint-dir DIR` (a directory every node sees: a lab's shared filesystem) each rank saves its state there
every `--checkpoint-every` iterations, as `DIR/rank-R/iter-K.bin`, and a job that starts again (requeued after a
lost node) goes on from the newest iteration every rank of it saved, whichever nodes it runs on now.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from controller.core.rack import RackError, load_rack
from controller.slurm.allocation import AllocationError, parse
from controller.slurm.conf import gpu_at


class RankError(RuntimeError):
    pass


def task_gpu(rack, node: str, env: dict[str, str], job_gpus: list[str]) -> str:
    """The rack's GPU this task runs on."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if visible and "," not in visible and visible.isdigit():
        gpu = gpu_at(rack, node, int(visible))
        if gpu in job_gpus:
            return gpu
    mine = [g for g in job_gpus if rack.server_of[g] == node]
    local = int(env.get("SLURM_LOCALID", "0"))
    if local >= len(mine):
        raise RankError(f"task {local} on {node}, which holds {len(mine)} GPU(s) of the job: start one task per GPU "
                        "(srun --ntasks-per-gpu=1, or --ntasks-per-node equal to the GPUs per node)")
    return mine[local]


def master_port(job: str) -> int:
    """The rendezvous port of a job: its own, as two jobs' rank 0 may share a node (and its addresses)."""
    return 30000 + int(job.split("_")[0].split("+")[0]) % 20000


def plan(rack, node: str, env: dict[str, str], job_gpus: list[str]) -> dict:
    """rank, world size, master address and port, NIC and GPU model of this task."""
    gpu = task_gpu(rack, node, env, job_gpus)
    return {"gpu": gpu, "rank": job_gpus.index(gpu), "world_size": len(job_gpus),
            "master": rack.addresses[job_gpus[0]][0], "port": master_port(env.get("SLURM_JOB_ID", "0")),
            "ifname": rack.interface(gpu), "model": rack.gpus[gpu].model}


def newest_checkpoint(directory: Path, world_size: int) -> int:
    """The newest iteration saved by every rank of the job in `directory` (0: none, start from the beginning)."""
    held = None
    for r in range(world_size):
        mine = {int(f.stem.split("-", 1)[1]) for f in (directory / f"rank-{r}").glob("iter-*.bin")
                if f.stem.split("-", 1)[1].isdigit()}
        held = mine if held is None else held & mine
    return max(held or {0})


def checkpoint_argv(p: dict, directory: str | None, every: int) -> list[str]:
    """The worker's checkpoint arguments: save into `directory` every `every` iterations, go on from the newest."""
    if not directory:
        return []
    start = newest_checkpoint(Path(directory), p["world_size"])
    # port 0: each rank's checkpoint server on a port of its own (two ranks may share a node); nothing fetches from
    # it, every rank restores from the directory
    out = ["--checkpoint-dir", directory, "--checkpoint-every", str(every), "--checkpoint-port", "0"]
    return out + (["--resume-from", str(start), "--restore-from", "local"] if start else [])


def worker_argv(rack, p: dict, extra: list[str], checkpoints: list[str] | None = None) -> list[str]:
    worker = shutil.which("optirack-worker") or str(Path(sys.argv[0]).resolve().parent / "optirack-worker")
    e = rack.spec.emulation
    return [worker, "--rank", str(p["rank"]), "--world-size", str(p["world_size"]), "--master", p["master"],
            "--master-port", str(p["port"]),
            "--ifname", p["ifname"], "--gpu-model", p["model"], "--rate-scale", str(e.rate_scale),
            "--time-dilation", str(e.time_dilation), "--wait-for-nic", "30", *(checkpoints or []), *extra]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="optirack-slurm-rank", description=__doc__.splitlines()[0])
    ap.add_argument("--rack", default=os.environ.get("OPTIRACK_RACK"), help="the rack file ($OPTIRACK_RACK)")
    ap.add_argument("--checkpoint-dir", help="save checkpoints here and go on from the newest (a directory every "
                    "node sees)")
    ap.add_argument("--checkpoint-every", type=int, default=5, metavar="K",
                    help="iterations between two checkpoints (0: save none, only go on from one) (%(default)s)")
    ap.add_argument("--dry-run", action="store_true", help="print the worker's command line instead of running it")
    args = ap.parse_args(ours)
    if args.checkpoint_every < 0:
        ap.error(f"--checkpoint-every must be 0 or more, not {args.checkpoint_every}")
    job = os.environ.get("SLURM_JOB_ID")
    if not job or not args.rack:
        print("optirack-slurm-rank: run it under srun, with --rack FILE (or $OPTIRACK_RACK)", file=sys.stderr)
        return 2
    try:
        rack = load_rack(args.rack)
        shown = subprocess.run(["scontrol", "show", "job", "-d", job], capture_output=True, text=True, timeout=30)
        if shown.returncode != 0:
            raise RankError(f"scontrol show job {job}: {shown.stderr.strip()}")
        job_gpus = parse(rack, job, shown.stdout).gpus
        p = plan(rack, os.environ.get("SLURMD_NODENAME") or socket.gethostname(), dict(os.environ), job_gpus)
    except (RackError, AllocationError, RankError) as e:
        print(f"optirack-slurm-rank: {e}", file=sys.stderr)
        return 2
    cmd = worker_argv(rack, p, extra, checkpoint_argv(p, args.checkpoint_dir, args.checkpoint_every))
    if args.dry_run:
        print(" ".join(cmd), flush=True)
        return 0
    os.environ.pop("OPTIRACK_GPU_ID", None)  # checkpoints are written by rank (rank-R): the GPUs change on a requeue
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())

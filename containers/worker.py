"""optirack-worker: one rank of synchronous data-parallel training with ring all-reduce.

Two modes:
  profile  the gradient size and the per-iteration compute time come from the profile table
           (profiles/__init__.py) for the workload and this GPU's model; sizes are scaled by
           the rack's rate scale, compute times are not. On a real GPU the compute phase keeps
           the GPU computing (chained matrix products) for that time, so NVML reads what a
           training step would; on an emulated GPU it is waited out. The all-reduce is real
           traffic on real tensors, and its result is checked every iteration.
  real     a real PyTorch model (a small VGG-style CNN) trained on synthetic data, on the GPU
           if one is visible, else on the CPU; gradients are all-reduced and the replicas are
           checked to be identical at the end.

The collective backend is NCCL when a GPU is visible (bound to --cuda-device) and gloo
otherwise; both run ring all-reduce. With --collective aggregate the gradients are summed
instead at an in-network aggregator (python -m containers.aggregator), streamed over UDP.
Each iteration prints one JSON line: compute and communication time, and GPU utilization
(NVML where a GPU exists, the compute-busy fraction otherwise; the start line says which).
Two ranks on one GPU end with one line saying so (exit 4).

In a container the driver sets OPTIRACK_GPU_ID / OPTIRACK_GPU_MODEL and hands over the NIC; to
debug outside one, run the ranks by hand, e.g. on loopback:
  optirack-worker --rank 0 --world-size 2 --master 127.0.0.1 --ifname lo --iterations 3 &
  optirack-worker --rank 1 --world-size 2 --master 127.0.0.1 --ifname lo --iterations 3
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import threading
import time
from datetime import timedelta

from containers import aggproto
from containers.aggregate import Aggregation
from containers.gpu import BusyGpu, Utilization, Wait, compute_phase  # noqa: F401 (tests take them from here)
from containers.ring import Abandoned, Ring
from containers.session import _EMIT, _THREAD, SESSION, Checkpoints, Control, emit
from containers.train import run_profile, run_real
from profiles import GPU_MODELS, WORKLOADS


def wait_for_nic(ifname: str, timeout: float) -> str:
    """Wait until the driver has handed this container its NIC, up and addressed; return the address."""
    import fcntl
    import struct

    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))  # SIOCGIFADDR
                return socket.inet_ntoa(packed[20:24])
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"optirack-worker: no address on interface {ifname} after {timeout:g} s") from None
            time.sleep(0.05)


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="optirack-worker", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master", required=True, help="address of rank 0 (its NIC's address)")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument(
        "--ifname", default=env("OPTIRACK_IFNAME"), help="the NIC the collective uses (GLOO/NCCL_SOCKET_IFNAME)"
    )
    p.add_argument("--mode", choices=["profile", "real"], default="profile")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="vgg16", help="profile mode's workload")
    p.add_argument("--gpu-model", choices=sorted(GPU_MODELS), default=env("OPTIRACK_GPU_MODEL", "M40"))
    p.add_argument(
        "--rate-scale", type=float, default=1.0, help="scale of gradient sizes (the rack's emulation rate scale)"
    )
    p.add_argument(
        "--time-dilation",
        type=float,
        default=1.0,
        help="multiply compute time and gradient size (the rack's emulation.time_dilation)",
    )
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--batch", type=int, default=32, help="real mode's batch size")
    p.add_argument("--compute-seconds", type=float, help="override the profile's compute time")
    p.add_argument("--gradient-bytes", type=int, help="override the (scaled) gradient size")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument(
        "--cuda-device",
        type=int,
        default=int(env("OPTIRACK_CUDA_DEVICE", "0")),
        help="the CUDA device of this rank where a GPU is visible (in a container that holds one GPU: 0)",
    )
    p.add_argument(
        "--allreduce",
        choices=["ring", "builtin"],
        default="ring",
        help="ring: our ring on gloo's point-to-point (NCCL always uses its own ring); builtin: the backend's",
    )
    a = p.add_argument_group("in-network aggregation (containers/aggregator.py)")
    a.add_argument("--collective", choices=["ring", "aggregate"], default="ring",
                   help="ring: all-reduce on torch.distributed (see --allreduce); aggregate: sum the gradients at the "
                        "aggregator of --aggregator (a job it refuses runs as a ring, and its start line says why)")
    a.add_argument("--aggregator", metavar="HOST:PORT", help="the in-network aggregator (with --collective aggregate)")
    a.add_argument("--aggregation-job", type=int, metavar="KEY",
                   help="the job's key at the aggregator, the same on every rank (default: from --master, "
                        "--master-port and --attempt)")
    a.add_argument("--aggregation-slots", type=int,
                   help="slots of the job's pool at the aggregator (default: about 64 kB of slots in all)")
    a.add_argument("--aggregation-chunk", type=int,
                   help="float32 elements per slot, one datagram each (default: what fills one frame of --ifname's "
                        f"MTU; {aggproto.DEFAULT_CHUNK} without --ifname)")
    a.add_argument("--aggregation-rto", type=float, default=0.05, metavar="SECONDS",
                   help="a chunk whose sum has not come back is sent again after this, doubling (default 0.05)")
    p.add_argument(
        "--wait-for-nic",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait this long for --ifname to get its address (in a container, the driver moves it in)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a collective may stall before failing")
    p.add_argument("--warm", action="store_true",
                   help="a warm spare: import the framework, then wait for a regroup command giving the rank")
    p.add_argument("--attempt", type=int, default=0, help="the job's attempt this rank belongs to (in every line)")
    p.add_argument("--control-dir", default="/tmp/optirack-control",
                   help="where the controller hands this worker commands (regroup-<attempt>.json: see Control)")
    c = p.add_argument_group("checkpoints (containers/checkpoint.py)")
    c.add_argument("--checkpoint-dir", help="where this server keeps checkpoints (a volume that outlives the worker)")
    c.add_argument("--checkpoint-every", type=int, default=0, metavar="K", help="save every K iterations (0: never)")
    c.add_argument("--checkpoint-peer", help="the NIC address of the rank on another server that keeps a copy")
    c.add_argument("--checkpoint-port", type=int, default=29501, help="where every worker serves checkpoints")
    c.add_argument("--resume-from", type=int, default=0, metavar="ITERATION", help="go on from this checkpoint")
    c.add_argument("--restore-from", help="the holder's NIC address, or 'local' (this server's copy)")
    c.add_argument("--restore-writer", help="whose checkpoint to restore (the GPU that wrote it; default this one)")
    return p


def duplicate_gpu(error: BaseException) -> str | None:
    """NCCL's refusal of two ranks on one GPU, as one line a user can act on (None: another error)."""
    text = str(error)
    if "Duplicate GPU detected" not in text:
        return None
    m = re.search(r"rank (\d+) and rank (\d+) both on CUDA device (\w+)", text)
    who = (
        f"ranks {m.group(2)} and {m.group(1)} are both on CUDA device {m.group(3)}" if m else "two ranks share one GPU"
    )
    return f"{who}: NCCL needs one GPU per rank (give each rank its own GPU, e.g. one container per GPU)"


def _session(args, dist, torch, device, util, backend: str, extra: dict, ckpt: Checkpoints, out: dict) -> None:
    """One ring: restore, rendezvous, train to the end (the thread that a regroup leaves behind if it is stuck or
    still computing: its ring's collectives then raise Abandoned, so it never sends on the next ring)."""
    gen = _THREAD.gen = SESSION["gen"]
    try:
        restored = ckpt.restore()
        dist.init_process_group(
            backend,
            init_method=f"tcp://{args.master}:{args.master_port}",
            rank=args.rank,
            world_size=args.world_size,
            timeout=timedelta(seconds=args.timeout),
            **extra,
        )
        ring = Ring(dist, current=lambda: SESSION["gen"] == gen)
        bind = wait_for_nic(args.ifname, 0.0) if args.ifname else "0.0.0.0"
        agg = Aggregation.start(args, ring, torch, device, bind)  # None with --collective ring
        ring.aggregation = agg
        ring.barrier()  # start together: the first iteration should not include joining
        out["formed"] = True
        t0 = time.time()
        if args.mode == "profile":
            run_profile(args, ring, torch, device, util, ckpt=ckpt, restored=restored)
        else:
            run_real(args, ring, torch, device, util, ckpt=ckpt, restored=restored)
        ckpt.finish()
        if agg is not None:
            agg.close()
        ring.barrier()
        out["total_s"] = time.time() - t0
    except Abandoned:
        return  # left for a newer ring: nothing of this one matters any more
    except BaseException as e:  # noqa: BLE001 (handed to the main thread, which decides)
        out["error"] = e


def _run(args, dist, torch, device, util, backend: str, extra: dict, ckpt: Checkpoints, control: Control):
    """Run one ring in a thread; the main thread watches for a regroup command. Returns the session's result (its
    `total_s`) or the command; raises what ended the ring if no command comes within --timeout."""
    out: dict = {}
    t = threading.Thread(target=_session, args=(args, dist, torch, device, util, backend, extra, ckpt, out),
                         daemon=True)
    t.start()
    deadline = None
    while True:
        heartbeat()
        command = control.regroup(args.attempt)
        if command is not None:
            return command
        t.join(CONTROL_POLL)
        if t.is_alive():
            continue
        if "error" not in out:
            return out
        e = out["error"]
        if isinstance(e, SystemExit) or not out.get("formed") or duplicate_gpu(e):
            raise e  # not a peer lost from a ring that ran: as before
        if deadline is None:  # a peer is gone: wait for the controller's new ring, keeping this process
            emit({"event": "ring-broken", "rank": args.rank, "error": str(e).splitlines()[0][:200] if str(e) else
                  e.__class__.__name__, "t": time.time()})
            deadline = time.monotonic() + args.timeout
        if time.monotonic() > deadline:
            raise e
        time.sleep(CONTROL_POLL)
        heartbeat()


CONTROL_POLL = 0.02  # seconds between two looks for a command
HEARTBEAT_S = 0.1  # seconds between two heartbeat lines: the controller's failure detector takes a silent rank for
_BEAT = {"at": 0.0}  # a hung one (controller/jobs/detect.py), whatever its ring is doing (computing, or blocked)


def heartbeat() -> None:
    """A line saying this process lives, every HEARTBEAT_S (printed by the main thread, which a stuck ring's thread
    cannot hold up; a process stopped or hung prints none)."""
    now = time.monotonic()
    if now - _BEAT["at"] >= HEARTBEAT_S:
        _BEAT["at"] = now
        emit({"event": "alive", "t": time.time()})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.collective == "aggregate":
        if not args.aggregator:
            parser.error("--collective aggregate needs --aggregator HOST:PORT")
        try:
            aggproto.parse_address(args.aggregator)
            aggproto.check_shape(args.aggregation_slots or 1, args.aggregation_chunk or 1)
        except ValueError as e:
            parser.error(f"--aggregator/--aggregation-*: {e}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ifname:
        if args.wait_for_nic:
            wait_for_nic(args.ifname, args.wait_for_nic)
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
        os.environ["NCCL_SOCKET_IFNAME"] = args.ifname
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available()
    backend = ("nccl" if gpu else "gloo") if args.backend == "auto" else args.backend
    device = torch.device("cuda", args.cuda_device) if gpu and backend == "nccl" else torch.device("cpu")
    extra = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        extra["device_id"] = device  # NCCL binds this rank to its GPU instead of guessing from the rank
    util = Utilization(torch, args.cuda_device if gpu else None)
    SESSION["attempt"] = args.attempt
    control = Control(args.control_dir)
    if args.warm:  # a warm spare: started, PyTorch imported, waiting for a rank (its regroup command)
        emit({"event": "warm", "pid": os.getpid(), "t": time.time()})
        while (command := control.regroup(-1)) is None:
            heartbeat()
            time.sleep(CONTROL_POLL)
        t0 = time.time()
        args = parse_args(command["argv"])
        SESSION["attempt"] = args.attempt
        emit({"event": "handed", "rank": args.rank, "world_size": args.world_size, "pid": os.getpid(),
              "t_told": t0, "t": time.time()})
    ckpt = Checkpoints(args, args.rank)
    ckpt.serve()  # first: a restarting peer may fetch what this server holds
    while True:
        try:
            result = _run(args, dist, torch, device, util, backend, extra, ckpt, control)
        except Exception as e:  # noqa: BLE001 (one known misconfiguration gets one line; the rest a traceback)
            why = duplicate_gpu(e)
            if why is None:
                raise
            emit({"event": "error", "rank": args.rank, "error": why})
            print(f"optirack-worker: rank {args.rank}: {why}", file=sys.stderr, flush=True)
            return 4
        if "argv" not in result:
            break
        # a regroup: this process and its state stay; the ring it was in is left (a thread stuck in it is abandoned)
        t0 = time.time()
        new = parse_args(result["argv"])
        with _EMIT:
            SESSION["gen"] += 1
            SESSION["attempt"] = new.attempt
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 (the old ring is broken: what is left of it is dropped)
            print(f"optirack-worker: leaving the old ring: {e}", file=sys.stderr, flush=True)
        emit({"event": "regroup", "rank": new.rank, "world_size": new.world_size, "from_rank": args.rank,
              "resume_from": new.resume_from, "pid": os.getpid(), "leave_s": time.time() - t0, "t": time.time()})
        args = new
        ckpt = Checkpoints(args, args.rank, memory=ckpt.memory, server=ckpt.server)
    emit(
        {
            "event": "done",
            "rank": args.rank,
            "iterations": args.iterations,
            "total_s": result["total_s"],
            "check": "ok",
            "t": time.time(),
        }
    )
    sys.stdout.flush()
    # Leave without tearing the process group down: when peers close their connections at the
    # same moment, gloo's teardown sometimes aborts ("terminate called without an active
    # exception", seen about once in 50 runs), which would turn a finished job into a failed one.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

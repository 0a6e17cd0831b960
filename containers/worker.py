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
otherwise; both run ring all-reduce. Each iteration prints one JSON line: compute and
communication time, and GPU utilization (NVML where a GPU exists, the compute-busy fraction
otherwise; the start line says which). Two ranks on one GPU end with one line saying so (exit 4).

In a container the driver sets OPTIRACK_GPU_ID / OPTIRACK_GPU_MODEL and hands over the NIC; to
debug outside one, run the ranks by hand, e.g. on loopback:
  optirack-worker --rank 0 --world-size 2 --master 127.0.0.1 --ifname lo --iterations 3 &
  optirack-worker --rank 1 --world-size 2 --master 127.0.0.1 --ifname lo --iterations 3
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

from containers.gpu import BusyGpu, Utilization, Wait, compute_phase  # noqa: F401 (tests take them from here)
from containers.ring import open_ring, ring_all_reduce
from profiles import GPU_MODELS, WORKLOADS, compute_seconds

_EMIT = threading.Lock()  # the checkpoint thread prints too: one whole line at a time
# The ring this worker is in: its attempt (every line says it) and a generation that a regroup moves on; a thread of
# a ring the worker has left (blocked on a dead peer, or failing later) prints nothing more.
SESSION = {"attempt": 0, "gen": 0}
_THREAD = threading.local()


def emit(record: dict) -> None:
    gen = getattr(_THREAD, "gen", None)
    with _EMIT:
        if gen is not None and gen != SESSION["gen"]:
            return
        record.setdefault("attempt", SESSION["attempt"])
        print(json.dumps(record, separators=(",", ":")), flush=True)


class Checkpoints:
    """This rank's checkpoints (containers/checkpoint.py): the saver, and the state it restarts from."""

    def __init__(self, args, rank: int, memory: dict | None = None, server=None):
        from containers import checkpoint

        self.mod, self.args, self.rank = checkpoint, args, rank
        self.gen = SESSION["gen"]
        self.memory: dict[int, bytes] = memory if memory is not None else {}  # the newest states saved, in RAM
        self.server = server  # this worker's checkpoint server (serve): it serves this rank's states from memory
        self.root = Path(args.checkpoint_dir) if args.checkpoint_dir else None
        self.writer = os.environ.get("OPTIRACK_GPU_ID") or f"rank-{rank}"
        self.saver = None
        if self.root is not None and args.checkpoint_every > 0:
            self.saver = checkpoint.Saver(self.root, self.writer, args.checkpoint_every, args.checkpoint_peer,
                                          self._saved, args.checkpoint_port)

    def serve(self) -> None:
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            self.server = self.mod.Server(self.root, port=self.args.checkpoint_port)

    def _saved(self, iteration: int, size: int, local_s: float, total_s: float) -> None:
        if self.gen != SESSION["gen"]:
            return  # a save of a ring this worker has left
        emit({"event": "checkpoint", "rank": self.rank, "iteration": iteration, "bytes": size,
              "writer": self.writer, "peer": self.args.checkpoint_peer, "local_s": local_s, "save_s": total_s,
              "t": time.time()})

    def save(self, iteration: int, data) -> None:
        """After `iteration` completed iterations, if one is due (`data`: a callable giving the bytes)."""
        if self.saver is not None and self.saver.due(iteration) and iteration < self.args.iterations:
            state = data()
            self.memory[iteration] = state
            for old in sorted(self.memory)[:-self.mod.KEEP]:
                del self.memory[old]
            if self.server is not None:
                self.server.hold(self.writer, iteration, state)
            self.saver.save(iteration, state)

    def finish(self) -> None:
        if self.saver is not None:
            self.saver.wait()

    def restore(self) -> bytes | None:
        """The state to go on from (None: start at iteration 0)."""
        a = self.args
        if not a.resume_from:
            return None
        t0, writer = time.time(), a.restore_writer or self.writer
        if a.resume_from in self.memory:  # a rank that kept its process: its own state, from memory
            data, a.restore_from, writer = self.memory[a.resume_from], "memory", self.writer
        elif a.restore_from in (None, "local"):
            data = self.mod.load(self.root, writer, a.resume_from)
        else:
            data = self.mod.get(a.restore_from, writer, a.resume_from, a.checkpoint_port)
        emit({"event": "restored", "rank": self.rank, "iteration": a.resume_from, "writer": writer,
              "from": a.restore_from or "local", "bytes": len(data), "restore_s": time.time() - t0, "t": time.time()})
        return data


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


def _profile_sizes(args) -> tuple[int, float]:
    """Gradient elements and compute seconds of one iteration, with the rack's scale and dilation."""
    workload = WORKLOADS[args.workload]
    elements = max(1, round(workload.gradient_bytes * args.rate_scale * args.time_dilation / 4))
    if args.gradient_bytes is not None:
        elements = max(1, args.gradient_bytes // 4)
    compute = args.compute_seconds
    if compute is None:
        compute = compute_seconds(args.workload, args.gpu_model)
    return elements, compute * args.time_dilation


def all_reduce(args, dist, torch, tensor) -> None:
    if args.allreduce == "ring" and dist.get_backend() == "gloo":
        ring_all_reduce(dist, torch, tensor)
    else:
        dist.all_reduce(tensor)


def profile_state(torch, elements: int, iteration: int) -> bytes:
    """Profile mode's checkpoint: the size of the model's parameters and its optimizer's momentum (twice the
    gradient, scaled alike), holding the iteration it was saved after, which the restore checks."""
    return torch.full((2 * elements,), float(iteration), dtype=torch.float32).numpy().tobytes()


def profile_restored(torch, data: bytes, elements: int, iteration: int) -> None:
    state = torch.frombuffer(bytearray(data), dtype=torch.float32)
    if state.numel() != 2 * elements or not bool(torch.all(state == float(iteration))):
        raise SystemExit(f"optirack-worker: the checkpoint of iteration {iteration} does not hold that iteration")


def run_profile(args, dist, torch, device, util, work=None, ckpt=None, restored=None) -> None:
    elements, compute = _profile_sizes(args)
    start = args.resume_from if restored is not None else 0
    if restored is not None:
        profile_restored(torch, restored, elements, start)
    grad = torch.empty(elements, dtype=torch.float32, device=device)
    n, rank = dist.get_world_size(), dist.get_rank()
    work = work or compute_phase(torch, device)
    emit(
        {
            "event": "start",
            "rank": rank,
            "world_size": n,
            "mode": "profile",
            "workload": args.workload,
            "time_dilation": args.time_dilation,
            "gpu_model": args.gpu_model,
            "gradient_bytes": elements * 4,
            "compute_s": compute,
            "compute": work.name,
            "backend": dist.get_backend(),
            "utilization": util.source,
            "start_iteration": start,
            "t": time.time(),
        }
    )
    for it in range(start, args.iterations):
        t0 = time.time()
        work(compute)  # a real GPU computes for that long; an emulated one is waited out
        grad.fill_(float(rank + 1 + it))
        t1 = time.time()
        all_reduce(args, dist, torch, grad)
        expected = n * (n + 1) / 2 + n * it
        ok = bool(torch.all(grad == expected))  # synchronises with the device, too
        t2 = time.time()
        if not ok:
            emit(
                {
                    "event": "error",
                    "rank": rank,
                    "iteration": it,
                    "error": "all-reduce result is wrong",
                    "expected": expected,
                    "got": float(grad[0]),
                }
            )
            raise SystemExit(3)
        emit(
            {
                "event": "iteration",
                "rank": rank,
                "iteration": it,
                "t_start": t0,
                "t_end": t2,
                "compute_s": t1 - t0,
                "comm_s": t2 - t1,
                "iter_s": t2 - t0,
                "bytes": elements * 4,
                "gpu_util": util.sample(t1 - t0, t2 - t0),
            }
        )
        if ckpt is not None:
            ckpt.save(it + 1, lambda i=it + 1: profile_state(torch, elements, i))


def small_vgg(torch, classes: int = 10):
    nn = torch.nn
    layers, channels = [], 3
    for width in (32, 64, 128):
        layers += [
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
        channels = width
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * 4 * 4, 256), nn.ReLU(), nn.Linear(256, classes))


def run_real(args, dist, torch, device, util, ckpt=None, restored=None) -> None:
    import io

    torch.manual_seed(0)  # every replica starts from the same weights
    model = small_vgg(torch).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if restored is not None:  # the replicas are equal: any rank's checkpoint restores any rank
        state = torch.load(io.BytesIO(restored), map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["iteration"]

    def state_bytes(iteration: int) -> bytes:
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "iteration": iteration}, buf)
        return buf.getvalue()

    n, rank = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    emit(
        {
            "event": "start",
            "rank": rank,
            "world_size": n,
            "mode": "real",
            "workload": "small-vgg",
            "gradient_bytes": sum(p.numel() for p in params) * 4,
            "backend": dist.get_backend(),
            "device": str(device),
            "utilization": util.source,
            "start_iteration": start,
            "t": time.time(),
        }
    )
    for it in range(start, args.iterations):
        t0 = time.time()
        gen = torch.Generator().manual_seed(1000 + 100_003 * it + rank)  # each rank its own data, per iteration
        x = torch.randn(args.batch, 3, 32, 32, generator=gen).to(device)
        y = torch.randint(0, 10, (args.batch,), generator=gen).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.time()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        all_reduce(args, dist, torch, flat)
        flat /= n
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.time()
        opt.step()
        emit(
            {
                "event": "iteration",
                "rank": rank,
                "iteration": it,
                "t_start": t0,
                "t_end": t2,
                "compute_s": t1 - t0,
                "comm_s": t2 - t1,
                "iter_s": t2 - t0,
                "bytes": flat.numel() * 4,
                "loss": float(loss.detach()),
                "gpu_util": util.sample(t1 - t0, t2 - t0),
            }
        )
        if ckpt is not None:
            ckpt.save(it + 1, lambda i=it + 1: state_bytes(i))
    checksum = torch.stack([sum(p.detach().double().sum() for p in params)]).to(device)
    lo, hi = checksum.clone(), checksum.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if float(hi - lo) > 1e-6 * max(1.0, abs(float(hi))):
        emit({"event": "error", "rank": rank, "error": "replicas differ after training", "spread": float(hi - lo)})
        raise SystemExit(3)


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


class Control:
    """Commands from the controller: files it hands the worker's control directory (the driver's put_archive).
    `regroup-<attempt>.json` holds {"argv": [...]}: leave the ring and join the attempt's new one with these
    arguments (rank, world size, master and its port, the checkpoint to go on from, the peer), keeping this process
    and its state."""

    def __init__(self, root: str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def regroup(self, after: int) -> dict | None:
        """The newest regroup command for an attempt after `after` (None: none yet)."""
        found = []
        for p in self.root.glob("regroup-*.json"):
            n = p.stem.removeprefix("regroup-")
            if n.isdigit() and int(n) > after:
                found.append((int(n), p))
        if not found:
            return None
        try:
            return json.loads(max(found)[1].read_text())
        except ValueError:
            return None  # still being written: the next look reads it whole


def _session(args, dist, torch, device, util, backend: str, extra: dict, ckpt: Checkpoints, out: dict) -> None:
    """One ring: restore, rendezvous, train to the end (the thread that a regroup leaves behind if it is stuck)."""
    _THREAD.gen = SESSION["gen"]
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
        open_ring(dist)
        dist.barrier()  # start together: the first iteration should not include joining
        out["formed"] = True
        t0 = time.time()
        if args.mode == "profile":
            run_profile(args, dist, torch, device, util, ckpt=ckpt, restored=restored)
        else:
            run_real(args, dist, torch, device, util, ckpt=ckpt, restored=restored)
        ckpt.finish()
        dist.barrier()
        out["total_s"] = time.time() - t0
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


CONTROL_POLL = 0.02  # seconds between two looks for a command


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
            time.sleep(CONTROL_POLL)
        t0 = time.time()
        args = build_parser().parse_args(command["argv"])
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
        new = build_parser().parse_args(result["argv"])
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

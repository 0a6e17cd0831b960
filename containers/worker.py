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
import time
from datetime import timedelta

from profiles import GPU_MODELS, WORKLOADS, compute_seconds


def emit(record: dict) -> None:
    print(json.dumps(record, separators=(",", ":")), flush=True)


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


class Utilization:
    """GPU utilization: NVML's counter for this process's GPU where one is visible, else the fraction
    of the iteration spent computing (an emulated GPU is busy exactly while it computes)."""

    def __init__(self, torch=None, cuda_index: int | None = None):
        self.handle = None
        if cuda_index is not None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self.pynvml = pynvml
                self.handle = self._handle(torch, cuda_index)
            except Exception:  # noqa: BLE001 (no NVML: fall back to the busy fraction)
                self.handle = None

    def _handle(self, torch, cuda_index: int):
        """The NVML device of CUDA device `cuda_index`, found by PCI address: the two number GPUs
        differently whenever CUDA_VISIBLE_DEVICES or a container hides some of them."""
        props = torch.cuda.get_device_properties(cuda_index)
        bus = getattr(props, "pci_bus_id", None)
        if bus is None:
            return self.pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
        address = f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"
        return self.pynvml.nvmlDeviceGetHandleByPciBusId(address)

    @property
    def source(self) -> str:
        return "nvml" if self.handle is not None else "busy-fraction"

    def sample(self, busy: float, total: float) -> float:
        if self.handle is not None:
            return self.pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0
        return busy / total if total > 0 else 0.0


class Wait:
    """Profile mode's compute phase on an emulated GPU: wait it out (the host's cores stay free)."""

    name = "wait"

    def __call__(self, seconds: float) -> None:
        time.sleep(seconds)


class BusyGpu:
    """Profile mode's compute phase on a real GPU: keep it computing (chained matrix products,
    synchronised in slices of about 10 ms) for the profile's compute time, so that NVML reads
    the utilization a training step would cause instead of an idle GPU."""

    name = "gpu-busy"

    def __init__(self, torch, device, size: int = 2048, kernel=None):
        self.torch, self.device = torch, device
        a = torch.randn(size, size, device=device)
        out = torch.empty_like(a)
        self.kernel = kernel or (lambda: torch.mm(a, a, out=out))
        self.per_slice = 1

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def __call__(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            t0 = time.monotonic()
            for _ in range(self.per_slice):
                self.kernel()
            self._sync()
            took = time.monotonic() - t0
            if took < min(0.005, left / 2):
                self.per_slice *= 2
            elif took > 0.02 and self.per_slice > 1:
                self.per_slice //= 2


def compute_phase(torch, device):
    return BusyGpu(torch, device) if device.type == "cuda" else Wait()


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


def ring_all_reduce(dist, torch, tensor) -> None:
    """Sum `tensor` over all ranks in place: reduce-scatter then all-gather around the ring
    rank -> rank+1, one chunk of 1/n per step, each step's send overlapped with its receive.

    Used with gloo: its built-in all-reduce pipelines small segments and, on the emulated rack,
    reached about 81 % of the ring bound where this reaches about 90 % (scripts/bench_allreduce.py).
    """
    n, rank = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    chunks = list(tensor.chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    scratch = torch.empty_like(chunks[0])
    for step in range(n - 1):  # reduce-scatter: after it, rank r holds the sum of chunk r+1
        send, recv = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        req = dist.isend(send, right)
        incoming = scratch[: recv.numel()]
        dist.recv(incoming, left)
        recv += incoming
        req.wait()
    for step in range(n - 1):  # all-gather the summed chunks
        send, recv = chunks[(rank - step + 1) % n], chunks[(rank - step) % n]
        req = dist.isend(send, right)
        dist.recv(recv, left)
        req.wait()


def all_reduce(args, dist, torch, tensor) -> None:
    if args.allreduce == "ring" and dist.get_backend() == "gloo":
        ring_all_reduce(dist, torch, tensor)
    else:
        dist.all_reduce(tensor)


def run_profile(args, dist, torch, device, util, work=None) -> None:
    elements, compute = _profile_sizes(args)
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
            "t": time.time(),
        }
    )
    for it in range(args.iterations):
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


def run_real(args, dist, torch, device, util) -> None:
    torch.manual_seed(0)  # every replica starts from the same weights
    model = small_vgg(torch).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank has its own data
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
            "t": time.time(),
        }
    )
    for it in range(args.iterations):
        t0 = time.time()
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
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{args.master}:{args.master_port}",
            rank=args.rank,
            world_size=args.world_size,
            timeout=timedelta(seconds=args.timeout),
            **extra,
        )
        dist.barrier()  # start together: the first iteration should not include joining
        t0 = time.time()
        (run_profile if args.mode == "profile" else run_real)(args, dist, torch, device, util)
        dist.barrier()
    except Exception as e:  # noqa: BLE001 (one known misconfiguration gets one line; the rest a traceback)
        why = duplicate_gpu(e)
        if why is None:
            raise
        emit({"event": "error", "rank": args.rank, "error": why})
        print(f"optirack-worker: rank {args.rank}: {why}", file=sys.stderr, flush=True)
        return 4
    emit(
        {
            "event": "done",
            "rank": args.rank,
            "iterations": args.iterations,
            "total_s": time.time() - t0,
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

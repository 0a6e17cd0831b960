"""The training loops a ring runs: profile mode (the profile table's gradient and compute time, real traffic on
real tensors, the sum checked every iteration) and real mode (a small VGG-style CNN on synthetic data, the replicas
checked equal at the end). Every collective goes through the ring (containers/ring.py), never the default group."""
from __future__ import annotations

import time

from containers.gpu import compute_phase
from containers.session import emit
from profiles import WORKLOADS, compute_seconds


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


def all_reduce(args, ring, torch, tensor) -> None:
    agg = getattr(ring, "aggregation", None)
    if agg is not None and agg.client is not None:  # --collective aggregate, joined (containers/aggregate.py)
        ring.check()
        agg.all_reduce(torch, tensor)
    elif args.allreduce == "ring" and ring.backend == "gloo":
        ring.ring_all_reduce(torch, tensor)
    else:
        ring.all_reduce(tensor)


def collective_fields(ring) -> dict:
    """What the start line says of the collective: the ring, or the aggregator (or why it refused the job)."""
    agg = getattr(ring, "aggregation", None)
    return {"collective": "ring"} if agg is None else agg.fields()


def profile_state(torch, elements: int, iteration: int) -> bytes:
    """Profile mode's checkpoint: the size of the model's parameters and its optimizer's momentum (twice the
    gradient, scaled alike), holding the iteration it was saved after, which the restore checks."""
    return torch.full((2 * elements,), float(iteration), dtype=torch.float32).numpy().tobytes()


def profile_restored(torch, data: bytes, elements: int, iteration: int) -> None:
    state = torch.frombuffer(bytearray(data), dtype=torch.float32)
    if state.numel() != 2 * elements or not bool(torch.all(state == float(iteration))):
        raise SystemExit(f"optirack-worker: the checkpoint of iteration {iteration} does not hold that iteration")


def emit_iteration(rank: int, it: int, t0: float, t1: float, t2: float, nbytes: int, util, **extra) -> None:
    """One iteration's line: started at t0, computed until t1, all-reduced until t2 (both modes print it)."""
    emit({"event": "iteration", "rank": rank, "iteration": it, "t_start": t0, "t_end": t2, "compute_s": t1 - t0,
          "comm_s": t2 - t1, "iter_s": t2 - t0, "bytes": nbytes, **extra, "gpu_util": util.sample(t1 - t0, t2 - t0)})


def run_profile(args, ring, torch, device, util, work=None, ckpt=None, restored=None) -> None:
    elements, compute = _profile_sizes(args)
    start = args.resume_from if restored is not None else 0
    if restored is not None:
        profile_restored(torch, restored, elements, start)
    grad = torch.empty(elements, dtype=torch.float32, device=device)
    n, rank = ring.size, ring.rank
    work = work or compute_phase(torch, device, getattr(args, "control_dir", None))
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
            "backend": ring.backend,
            **collective_fields(ring),
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
        all_reduce(args, ring, torch, grad)
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
        emit_iteration(rank, it, t0, t1, t2, elements * 4, util)
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


def run_real(args, ring, torch, device, util, ckpt=None, restored=None) -> None:
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

    n, rank = ring.size, ring.rank
    params = list(model.parameters())
    emit(
        {
            "event": "start",
            "rank": rank,
            "world_size": n,
            "mode": "real",
            "workload": "small-vgg",
            "gradient_bytes": sum(p.numel() for p in params) * 4,
            "backend": ring.backend,
            **collective_fields(ring),
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
        all_reduce(args, ring, torch, flat)
        flat /= n
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.time()
        opt.step()
        emit_iteration(rank, it, t0, t1, t2, flat.numel() * 4, util, loss=float(loss.detach()),
                       grad_norm=float(flat.norm()))  # of the averaged gradient: the collectives compared by it
        if ckpt is not None:
            ckpt.save(it + 1, lambda i=it + 1: state_bytes(i))
    checksum = torch.stack([sum(p.detach().double().sum() for p in params)]).to(device)
    lo, hi = checksum.clone(), checksum.clone()
    ring.all_reduce(lo, op=ring.dist.ReduceOp.MIN)
    ring.all_reduce(hi, op=ring.dist.ReduceOp.MAX)
    if float(hi - lo) > 1e-6 * max(1.0, abs(float(hi))):
        emit({"event": "error", "rank": rank, "error": "replicas differ after training", "spread": float(hi - lo)})
        raise SystemExit(3)

"""The worker outside a container: ranks on loopback, real torch.distributed traffic."""
import json
import subprocess
import sys

import pytest

from emulation.harness import free_port
from profiles import GPU_MODELS, WORKLOADS, compute_seconds


def run_ranks(n: int, *args: str, timeout: float = 120) -> list[list[dict]]:
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "containers.worker", "--rank", str(r), "--world-size", str(n),
                               "--master", "127.0.0.1", "--master-port", port, "--ifname", "lo", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, stderr[-2000:]
        lines = [json.loads(line) for line in stdout.splitlines()]
        assert any(r["event"] == "alive" for r in lines), "no heartbeat"  # the failure detector's (detect.py)
        out.append([r for r in lines if r["event"] != "alive"])
    return out


@pytest.mark.parametrize("allreduce", ["ring", "builtin"])
def test_profile_mode_three_ranks(allreduce):
    results = run_ranks(3, "--iterations", "3", "--rate-scale", "0.0005", "--compute-seconds", "0.01",
                        "--allreduce", allreduce)
    for rank, records in enumerate(results):
        assert records[0]["event"] == "start" and records[0]["backend"] == "gloo"
        assert records[0]["gradient_bytes"] == round(WORKLOADS["vgg16"].gradient_bytes * 0.0005 / 4) * 4
        its = [r for r in records if r["event"] == "iteration"]
        assert [r["iteration"] for r in its] == [0, 1, 2]
        assert all(0 < r["gpu_util"] <= 1 and r["compute_s"] >= 0.01 for r in its)
        assert records[-1] == {**records[-1], "event": "done", "check": "ok", "rank": rank}


def test_uneven_chunks_and_two_ranks_real_mode():
    results = run_ranks(2, "--mode", "real", "--iterations", "2", "--batch", "4")
    assert all(r[-1]["check"] == "ok" for r in results)
    r0 = [x for x in results[0] if x["event"] == "iteration"]
    assert r0[0]["bytes"] > 1_000_000  # the model's gradients, all-reduced


def test_odd_sized_gradient_ring():
    results = run_ranks(3, "--iterations", "1", "--gradient-bytes", "40004", "--compute-seconds", "0")
    assert all(r[-1]["check"] == "ok" for r in results)


def test_profiles_have_sources_and_scale():
    assert compute_seconds("vgg16", "TitanXp") == pytest.approx(0.12862)
    assert compute_seconds("vgg16", "M40") > compute_seconds("vgg16", "TitanV")
    assert all(m.source for m in GPU_MODELS.values()) and all(w.source for w in WORKLOADS.values())


def test_help_explains_both_ways_to_run():
    out = subprocess.run([sys.executable, "-m", "containers.worker", "--help"], capture_output=True, text=True).stdout
    assert "profile" in out and "real" in out and "loopback" in out


RING_OF_TWO = r"""
import json, os, re, subprocess, sys
from datetime import timedelta
import torch, torch.distributed as dist
from containers import worker
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=timedelta(seconds=60))
ring = worker.Ring(dist) if sys.argv[3] == "ring" else None
t = torch.full((2_000_000,), float(rank + 1))
for _ in range(3):
    t.fill_(float(rank + 1))
    if sys.argv[3] == "ring":
        ring.ring_all_reduce(torch, t)
    else:  # one connection, both directions: what the ring of two did before Ring gave rank 1 its own group
        req = dist.isend(t[:1_000_000].clone(), 1 - rank)
        dist.recv(t[1_000_000:], 1 - rank)
        req.wait()
dist.barrier()
socks = []
out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True).stdout
for block in re.split(r"\n(?=\S)", out):
    if f"pid={os.getpid()}," in block:
        sent = re.search(r"bytes_sent:(\d+)", block)
        got = re.search(r"bytes_received:(\d+)", block)
        socks.append([int(sent.group(1)) if sent else 0, int(got.group(1)) if got else 0])
print(json.dumps({"sum": float(t[0]), "sockets": socks}), flush=True)
dist.barrier()
os._exit(0)
"""


def ring_of_two_sockets(how: str) -> list[dict]:
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", RING_OF_TWO, str(r), port, how], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.splitlines()[-1]))
    return out


def test_ring_of_two_sends_each_direction_on_its_own_connection():
    """Mechanism, read from the kernel's per-socket byte counters (ss): in a ring of two, each TCP
    connection that carried the gradient carried it one way only; the same counters on one
    shared connection show both ways (the check can fail)."""
    ring = ring_of_two_sockets("ring")
    assert all(r["sum"] == 3.0 for r in ring)
    for how, runs in (("ring", ring), ("shared", ring_of_two_sockets("shared"))):
        busy = [s for r in runs for s in r["sockets"] if max(s) > 4_000_000]  # >= half a gradient (8 MB)
        assert busy, f"{how}: no socket of the ranks carried the gradient: {runs}"
        duplex = [s for s in busy if min(s) > 0.01 * max(s)]
        assert bool(duplex) == (how == "shared"), f"{how}: sockets (sent, received): {busy}"

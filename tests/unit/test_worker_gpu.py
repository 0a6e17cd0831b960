"""The worker on a GPU host, with NVML and CUDA faked (no GPU here): truthful utilization in profile
mode, the device handed to the process group, and one clear line for two ranks on one GPU."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import torch

from containers import worker
from tests.integration.helpers import ROOT

PROPS = types.SimpleNamespace(pci_bus_id=0x1A, pci_device_id=0, pci_domain_id=0, name="Fake H100")


class FakeGpu:
    """Remembers when kernels ran; NVML's counter is the busy share of its last sample window."""

    def __init__(self, window: float = 0.2):
        self.window, self.busy = window, []

    def kernel(self, a, out):
        def run():
            t0 = time.monotonic()
            torch.mm(a, a, out=out)  # real work, on the CPU standing in for the GPU
            self.busy.append((t0, time.monotonic()))
        return run

    def utilization(self) -> int:
        now = time.monotonic()
        start = now - self.window
        busy = sum(max(0.0, min(b, now) - max(a, start)) for a, b in self.busy)
        return round(100 * busy / self.window)


def fake_nvml(gpu: FakeGpu, lookups: list):
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByPciBusId = lambda address: lookups.append(address) or "handle"
    m.nvmlDeviceGetHandleByIndex = lambda index: lookups.append(index) or "handle"
    m.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=gpu.utilization(), memory=0)
    return m


class OneRank:
    """A ring of one (containers/ring.py's Ring): all-reduce leaves the tensor as it is."""

    size, rank, backend = 1, 0, "nccl"

    def all_reduce(self, tensor, op=None):
        pass


def _profile_run(monkeypatch, capsys, work_of):
    gpu, lookups = FakeGpu(), []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpu, lookups))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: PROPS)
    util = worker.Utilization(torch, 0)
    args = worker.build_parser().parse_args(
        [
            "--rank",
            "0",
            "--world-size",
            "1",
            "--master",
            "127.0.0.1",
            "--iterations",
            "3",
            "--compute-seconds",
            "0.3",
            "--gradient-bytes",
            "4000",
        ]
    )
    worker.run_profile(args, OneRank(), torch, torch.device("cpu"), util, work=work_of(gpu))
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return records, lookups


def test_profile_mode_keeps_the_gpu_busy_and_nvml_reads_it(monkeypatch, capsys):
    a, out = torch.randn(128, 128), torch.empty(128, 128)

    def busy(gpu):
        return worker.BusyGpu(torch, torch.device("cpu"), kernel=gpu.kernel(a, out))

    records, lookups = _profile_run(monkeypatch, capsys, busy)
    start, its = records[0], [r for r in records if r["event"] == "iteration"]
    assert start["utilization"] == "nvml" and start["compute"] == "gpu-busy"
    assert lookups == ["00000000:1A:00.0"]  # the NVML device of this CUDA device, by PCI address
    assert len(its) == 3 and all(r["compute_s"] >= 0.3 for r in its)
    assert all(r["gpu_util"] > 0.3 for r in its), [r["gpu_util"] for r in its]


def test_waiting_out_the_compute_time_reads_zero_on_a_real_gpu(monkeypatch, capsys):
    """What issue 16 saw on an H100: an idle GPU while the process sleeps. The fake tells them apart."""
    records, _ = _profile_run(monkeypatch, capsys, lambda gpu: worker.Wait())
    assert records[0]["compute"] == "wait"
    assert all(r["gpu_util"] == 0.0 for r in records if r["event"] == "iteration")


def test_the_compute_phase_is_chosen_by_the_device():
    assert isinstance(worker.compute_phase(torch, torch.device("cpu")), worker.Wait)  # an emulated GPU: no CPU burnt
    fake = types.SimpleNamespace(randn=lambda *a, **k: "a", empty_like=lambda a: "out", mm=lambda *a, **k: None)
    assert isinstance(worker.compute_phase(fake, torch.device("cuda", 0)), worker.BusyGpu)


def test_busy_gpu_lasts_the_compute_time():
    calls = []
    work = worker.BusyGpu(torch, torch.device("cpu"), kernel=lambda: calls.append(time.sleep(0.0005)))
    t0 = time.monotonic()
    work(0.2)
    took = time.monotonic() - t0
    assert took >= 0.2 and len(calls) > 10 and work.per_slice > 1


DUPLICATE = """
import sys, types
import torch, torch.distributed as dist
from containers import worker
from containers.session import _EMIT
props = types.SimpleNamespace(pci_bus_id=0x1A, pci_device_id=0, pci_domain_id=0)
torch.cuda.is_available = lambda: True
torch.cuda.set_device = lambda device: None
torch.cuda.get_device_properties = lambda index: props
nvml = types.ModuleType("pynvml")
nvml.nvmlInit = lambda: None
nvml.nvmlDeviceGetHandleByPciBusId = lambda address: "handle"
sys.modules["pynvml"] = nvml
def init(backend, **kw):
    with _EMIT:  # one whole line, as the worker's own lines (its heartbeats print meanwhile)
        print("init", backend, kw.get("device_id"), file=sys.stdout, flush=True)
    raise dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1936, invalid usage (run with NCCL_DEBUG=WARN "
                                "for details), NCCL version 2.28.3\\nncclInvalidUsage: This usually reflects invalid "
                                "usage of NCCL library.\\nLast error:\\nDuplicate GPU detected : rank 1 and rank 0 "
                                "both on CUDA device 1a000")
dist.init_process_group = init
sys.exit(worker.main(["--rank", "1", "--world-size", "2", "--master", "127.0.0.1", "--iterations", "1"]))
"""


def test_two_ranks_on_one_gpu_end_with_one_clear_line():
    proc = subprocess.run([sys.executable, "-c", DUPLICATE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ranks 0 and 1 are both on CUDA device 1a000" in lines[0], proc.stderr
    assert "one GPU per rank" in lines[0]
    out = [line for line in proc.stdout.splitlines() if '"event":"alive"' not in line]  # heartbeats aside
    assert out[0] == "init nccl cuda:0"  # the process group was told its device
    assert lines[0].startswith("optirack-worker: rank 1: ")
    assert json.loads(out[1]) == {
        "event": "error",
        "rank": 1,
        "error": lines[0].removeprefix("optirack-worker: rank 1: "),
        "attempt": 0,  # every line says which attempt of the job it belongs to
    }


def test_only_the_duplicate_gpu_gets_a_line_of_its_own():
    assert worker.duplicate_gpu(RuntimeError("Connection reset by peer")) is None  # others keep their traceback
    assert worker.duplicate_gpu(RuntimeError("Duplicate GPU detected")).startswith("two ranks share one GPU")

"""What a rank's GPU does and reports: its compute phase in profile mode (waited out on an emulated GPU, kept busy
on a real one) and its utilization (NVML's counter where a GPU is visible, else the compute-busy fraction)."""
from __future__ import annotations

import time
from pathlib import Path


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
    """Profile mode's compute phase on an emulated GPU: wait it out (the host's cores stay free). An emulated GPU can
    be throttled, as a hot or failing one is: a factor in the file SLOWDOWN of the worker's control directory (handed
    in as the controller's commands are) multiplies its compute time from the next iteration on; the fault tests and
    benchmarks make stragglers so (controller/jobs/detect.py reports them)."""

    name = "wait"
    SLOWDOWN = "slowdown"

    def __init__(self, control_dir: str | None = None):
        self.slowdown = Path(control_dir) / self.SLOWDOWN if control_dir else None

    def factor(self) -> float:
        if self.slowdown is None:
            return 1.0
        try:
            return max(1.0, float(self.slowdown.read_text()))
        except (OSError, ValueError):
            return 1.0

    def __call__(self, seconds: float) -> None:
        time.sleep(seconds * self.factor())


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


def compute_phase(torch, device, control_dir: str | None = None):
    return BusyGpu(torch, device) if device.type == "cuda" else Wait(control_dir)

"""Compute profiles of GPU models and training workloads (stdlib only: the worker and the controller import it).

The worker's profile mode waits out ``compute_seconds`` and all-reduces a real tensor of
``gradient_bytes``; both come from here. Every figure names its source.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str
    fp32_tflops: float
    memory_gib: int
    source: str


@dataclass(frozen=True)
class Workload:
    name: str
    parameters: int
    batch: int
    reference_ms: float  # one forward+backward pass of `batch` samples on REFERENCE_GPU
    source: str

    @property
    def gradient_bytes(self) -> int:
        return self.parameters * 4  # fp32 gradients


# Peak FP32 figures are from NVIDIA's product datasheets.
GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("M40", 7.0, 12, "NVIDIA Tesla M40 datasheet: 7 TFLOPS FP32, 12 GB (paper's servers)"),
        GpuModel("TitanXp", 11.0, 12, "NVIDIA TITAN X (Pascal) specifications: 11 TFLOPS FP32"),
        GpuModel("TitanV", 14.9, 12, "NVIDIA TITAN V specifications: 14.9 TFLOPS FP32 (paper's 2 extra GPUs)"),
        GpuModel("P100", 9.3, 16, "NVIDIA Tesla P100 PCIe datasheet: 9.3 TFLOPS FP32"),
        GpuModel("V100", 15.7, 32, "NVIDIA Tesla V100 SXM2 datasheet: 15.7 TFLOPS FP32"),
        GpuModel("A100", 19.5, 80, "NVIDIA A100 datasheet: 19.5 TFLOPS FP32 (non-TF32)"),
        GpuModel("H100", 67.0, 80, "NVIDIA H100 SXM datasheet: 67 TFLOPS FP32"),
    )
}

# Per-pass times measured on a Pascal Titan X with cuDNN 5.1, 224x224 inputs, batch 16
# (J. Johnson, "cnn-benchmarks", 2016). Parameter counts: VGG16 from Simonyan & Zisserman
# (2015, configuration D), ResNet-50 from He et al. (2016) as counted by torchvision.
REFERENCE_GPU = "TitanXp"
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("vgg16", 138_357_544, 16, 128.62, "cnn-benchmarks VGG-16, Pascal Titan X, batch 16"),
        Workload("resnet50", 25_557_032, 16, 103.58, "cnn-benchmarks ResNet-50, Pascal Titan X, batch 16"),
    )
}


def compute_seconds(workload: str, gpu_model: str) -> float:
    """One iteration's compute time on `gpu_model`: the reference time scaled by peak FP32.

    Scaling by peak FP32 is our simplification; it keeps the ratio between GPU models that
    the datasheets give and is exact for the reference GPU.
    """
    w = WORKLOADS[workload]
    ratio = GPU_MODELS[REFERENCE_GPU].fp32_tflops / GPU_MODELS[gpu_model].fp32_tflops
    return w.reference_ms / 1000.0 * ratio

"""What one iteration of a simulated job costs: the CNN profiles of profiles/__init__.py, or
transformer training sized from a parameter count.

A transformer workload is named `transformer:<parameters>`, e.g. `transformer:7e9`. From the
parameter count P (assumptions stated here, figures from public sources):
- compute per GPU per iteration: 6 P x TOKENS_PER_GPU FLOPs (forward and backward) at MFU of
  the GPU's dense 16-bit tensor peak (TENSOR_TFLOPS, NVIDIA's datasheets);
- memory: 16 bytes per parameter (16-bit weights and gradients, fp32 master weights and Adam's
  two moments), sharded over a tensor-parallel group of t GPUs inside one server: the fewest t
  (a power of two up to the server's GPUs and the job's) with 16 P / t within MEMORY_USE of the
  GPU's memory; where even the whole server does not hold it, t is the server (pipeline
  parallelism across servers is not modelled);
- tensor-parallel traffic stays in the server (its NVLink domain, `nvlink_bps`; the NIC when 0):
  4 all-reduces per layer per iteration of tokens x hidden x 2 bytes, with hidden = (128 P / 12)^(1/3)
  and layers = hidden / 128 (P = 12 layers x hidden^2 at GPT-3's width-to-depth ratio);
- data parallelism across NICs: a ring all-reduce of the 16-bit gradients each GPU holds, 2 P / t
  bytes (t parallel rings of the job's data-parallel ranks, modelled as one ring over all its GPUs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from profiles import GPU_MODELS, WORKLOADS, compute_seconds

TOKENS_PER_GPU = 16_384  # per iteration: e.g. 8 sequences of 2,048 tokens (assumed)
MFU = 0.4  # model FLOPs utilization (assumed; large trainings report 0.35-0.55)
MEMORY_USE = 0.75  # of a GPU's memory for weights, gradients and optimizer state; the rest for activations
BYTES_PER_PARAMETER = 16
# dense FP16/BF16 tensor TFLOPS from NVIDIA's datasheets (M40 and TitanXp have no tensor cores: their FP32 peak)
TENSOR_TFLOPS = {"M40": 7.0, "TitanXp": 11.0, "TitanV": 110.0, "P100": 18.7, "V100": 125.0, "A100": 312.0,
                 "H100": 989.0}


@dataclass(frozen=True)
class Transformer:
    parameters: float

    @property
    def hidden(self) -> float:
        return (128 * self.parameters / 12) ** (1 / 3)

    @property
    def layers(self) -> float:
        return self.hidden / 128

    def tensor_parallel(self, gpu_model: str, server_gpus: int, job_gpus: int) -> int:
        limit = max(1, min(server_gpus, job_gpus))
        memory = GPU_MODELS[gpu_model].memory_gib * 2**30 * MEMORY_USE
        t = 1
        while t * 2 <= limit and BYTES_PER_PARAMETER * self.parameters / t > memory:
            t *= 2
        return t

    def compute_s(self, gpu_model: str) -> float:
        return 6 * self.parameters * TOKENS_PER_GPU / (TENSOR_TFLOPS[gpu_model] * 1e12 * MFU)

    def tensor_parallel_s(self, t: int, nvlink_bps: float) -> float:
        if t == 1:
            return 0.0
        tokens = TOKENS_PER_GPU * t  # a tensor-parallel group works on its GPUs' tokens together
        per_allreduce = tokens * self.hidden * 2 * 2 * (t - 1) / t
        return 4 * self.layers * per_allreduce / nvlink_bps

    def gradient_bytes(self, t: int) -> float:
        return 2 * self.parameters / t


def parse(model: str) -> Transformer | None:
    """`transformer:<parameters>` -> Transformer; None for another name; ValueError when malformed."""
    if not model.startswith("transformer:"):
        return None
    text = model.partition(":")[2]
    try:
        p = float(text)
    except ValueError:
        raise ValueError(f"{model!r}: the parameter count {text!r} is not a number (e.g. transformer:7e9)") from None
    if not math.isfinite(p) or not 1e6 <= p <= 1e13:
        raise ValueError(f"{model!r}: the parameter count must be between 1e6 and 1e13")
    return Transformer(p)


def check(model: str) -> str:
    """The model name, or ValueError naming what is known."""
    if model in WORKLOADS or parse(model) is not None:
        return model
    raise ValueError(f"unknown model {model!r} (known: {', '.join(sorted(WORKLOADS))}, transformer:<parameters>)")


@dataclass(frozen=True)
class Cost:
    compute_s: list[float]  # per GPU, in rank order: its compute phase (and tensor-parallel traffic)
    gradient_bytes: float  # each GPU's share all-reduced across NICs
    tensor_parallel: int = 1


def cost(model: str, gpu_models: list[str], server_gpus: int, nvlink_bps: float, nic_bps: float) -> Cost:
    """One iteration of `model` on GPUs of `gpu_models`, in servers of `server_gpus` GPUs."""
    t_model = parse(model)
    if t_model is None:
        each = {m: compute_seconds(model, m) for m in set(gpu_models)}  # a job's GPUs are of a model or two
        return Cost([each[m] for m in gpu_models], WORKLOADS[model].gradient_bytes)
    slowest = min(gpu_models, key=lambda m: GPU_MODELS[m].memory_gib)
    t = t_model.tensor_parallel(slowest, server_gpus, len(gpu_models))
    tp_s = t_model.tensor_parallel_s(t, nvlink_bps or nic_bps)
    return Cost([t_model.compute_s(m) + tp_s for m in gpu_models], t_model.gradient_bytes(t), t)

"""FLOPs per sample (counted, or the transformer formula) and peak FLOP/s by device and dtype, for MFU.

MFU = achieved model FLOP/s / peak. Model FLOPs exclude activation-checkpoint recompute (they are
counted before checkpointing is applied), so MFU never credits wasted work.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# Dense (no sparsity) peak FLOP/s from vendor datasheets, keyed by the model's words in the device name
# ("NVIDIA H100 80GB HBM3" → "H100"; the longest matching key wins, so "H100 NVL" beats "H100").
# fp32 = plain IEEE fp32 on CUDA cores; tf32/bf16/fp16 = tensor cores.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200 NVL": {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835e12, "fp16": 835e12},
    "H200": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12},
    "H100 PCIe": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "H100 NVL": {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835e12, "fp16": 835e12},
    "H100": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12},
    "GH200": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12},
    "B200": {"fp32": 80e12, "tf32": 1100e12, "bf16": 2250e12, "fp16": 2250e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "A10G": {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12},
    "L40S": {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12},
    "L40": {"fp32": 90.5e12, "tf32": 90.5e12, "bf16": 181e12, "fp16": 181e12},
    "L4": {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12},
    "RTX 4090": {"fp32": 82.6e12, "tf32": 82.6e12, "bf16": 165e12, "fp16": 165e12},
    "RTX 3090": {"fp32": 35.6e12, "tf32": 35.6e12, "bf16": 71e12, "fp16": 71e12},
    "V100": {"fp32": 15.7e12, "tf32": 15.7e12, "bf16": 15.7e12, "fp16": 125e12},
    "T4": {"fp32": 8.1e12, "tf32": 8.1e12, "bf16": 8.1e12, "fp16": 65e12},
}


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """Peak FLOP/s for the device and precision; None where unknown (CPU, unlisted GPUs) → MFU null."""
    if device.type != "cuda":
        return None
    table = lookup_peak(torch.cuda.get_device_name(device))
    return table["fp32" if dtype == "fp32" else dtype] if table else None


def lookup_peak(device_name: str) -> dict[str, float] | None:
    """The peak table of a device name, matched on whole words ("L4" is not "L40S")."""
    words = device_name.replace("-", " ").split()
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):  # most specific name first
        k = key.split()
        if any(words[i:i + len(k)] == k for i in range(len(words))):
            return PEAK_FLOPS[key]
    return None


def count_train_flops(step: Callable[[], torch.Tensor]) -> float:
    """FLOPs of one forward + backward, counted by FlopCounterMode while running `step` (which returns
    the loss). Usage: `count_train_flops(lambda: loss_fn(model(x), y))`."""
    with FlopCounterMode(display=False) as counter:
        step().backward()
    return float(counter.get_total_flops())


def flops_per_sample(model: nn.Module, sample: tuple[torch.Tensor, torch.Tensor],
                     loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[float, str]:
    """Training FLOPs per sample and how they were obtained. Transformers that define
    `flops_per_token(seq_len)` use that formula (comparable with published MFU); others are counted on
    a two-sample batch (gradients are cleared afterwards)."""
    x, _ = sample
    if hasattr(model, "flops_per_token") and x.dim() == 2:
        return float(model.flops_per_token(x.shape[1]) * x.shape[1]), "formula 6N+12LDT per token"
    xs, ys = (t[:2] for t in sample)
    flops = count_train_flops(lambda: loss_of(xs, ys)) / xs.shape[0]
    model.zero_grad(set_to_none=True)
    return flops, "counted (FlopCounterMode)"

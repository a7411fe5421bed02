"""Convnet kernels (`kernels.convnet`): exact rewrites of two layers that torch runs far below the GPU's speed
in a compiled, channels_last, bf16 convnet step — the stem convolution over RGB (`stem.py`: space-to-depth)
and max pooling (`max_pool.py`: Triton kernels). Both keep every module's parameters and state_dict; only
forwards change, and both compute the same math (the pool bit for bit, the stem up to summation order).

Measured on ResNet-50 (one H100, batch 256, bf16, compiled with CUDA graphs, `benchmarks/NOTES.md` session 17):
in a plain compiled loop the stem +3.5 %, the pool +1.0 %, both +4.5 % images/s; through turbotrain both +2.9 %.
"""
from __future__ import annotations

import torch
from torch import nn

from turbotrain.accel.convnet.max_pool import swap_max_pools
from turbotrain.accel.convnet.stem import is_stem, swap_stems
from turbotrain.log import say


def convnet_targets(model: nn.Module) -> int:
    """How many layers `apply_convnet_kernels` would rewrite (stem-like convs and max pools)."""
    return sum(1 for m in model.modules() if is_stem(m) or type(m) is nn.MaxPool2d)


def apply_convnet_kernels(model: nn.Module, device: torch.device) -> None:
    """Rewrite `model`'s stem-like convs and (on a GPU) max pools in place, before compile traces them."""
    stems = swap_stems(model)
    pools = swap_max_pools(model) if device.type == "cuda" else 0
    left = sum(1 for m in model.modules() if type(m) is nn.MaxPool2d)
    why = "on a CPU" if device.type != "cuda" else "triton is not installed"
    say(f"kernels.convnet: {stems} stem conv(s) as space-to-depth, {pools} max pool(s) by Triton kernels"
        + (f" ({left} left to torch: {why})" if left else ""))

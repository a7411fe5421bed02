"""Convnet kernels (`kernels.convnet`): exact rewrites of the layers that torch runs far below the GPU's speed
in a compiled, channels_last, bf16 convnet step — the stem convolution over RGB (`stem.py`: space-to-depth),
max pooling (`max_pool.py`: Triton kernels) and the stem's batch norm + ReLU + max pool in one layer
(`bn_relu_pool.py`: Triton kernels that never write the full-resolution activation). All keep every module's
parameters and state_dict; only forwards change, and all compute the same math (the pool bit for bit, the
others up to summation order). What they buy is measured in docs/benchmarks.md (ResNet-50, the convnet kernels).
"""
from __future__ import annotations

import torch
from torch import nn

from turbotrain.accel.convnet import bn_relu_pool, max_pool
from turbotrain.accel.convnet.stem import is_stem, set_stems
from turbotrain.log import say


def convnet_targets(model: nn.Module, device: torch.device) -> int:
    """How many layers `set_convnet_kernels` would rewrite on `device`: stem-like convs, and max pools (alone or
    fused with the batch norm and ReLU before them) on a GPU with triton installed."""
    pools = device.type == "cuda" and max_pool.available()
    return sum(1 for m in model.modules() if is_stem(m) or (pools and max_pool.is_pool(m)))


def set_convnet_kernels(model: nn.Module, on: bool, device: torch.device) -> None:
    """`model`'s stem-like convs, max pools and batch norm + ReLU + max pool runs rewritten (on; the last two only
    on a GPU) or back to torch's own layers (off: the model as the user built it), in place; before compile
    traces them."""
    gpu = on and device.type == "cuda"
    fused = bn_relu_pool.set_fused(model, gpu)
    if not on:
        set_stems(model, False)
        max_pool.set_max_pools(model, False)
        return
    stems, pools = set_stems(model, True), max_pool.set_max_pools(model, gpu)
    left = sum(1 for m in model.modules() if type(m) is nn.MaxPool2d)
    why = "on a CPU" if device.type != "cuda" else "triton is not installed"
    say(f"kernels.convnet: {stems} stem conv(s) as space-to-depth, {pools} max pool(s) by Triton kernels, "
        f"{fused} batch norm + ReLU + max pool run(s) fused" + (f" ({left} left to torch: {why})" if left else ""))

"""FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded across ranks.

Each repeated block is its own FSDP unit (its all-gather overlaps the previous block's compute), then
the root takes the rest (embeddings, head). Mixed precision through MixedPrecisionPolicy: bf16/fp16
params for compute, fp32 gradient reduction, fp32 sharded master weights.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from turbotrain.accel.compile import find_blocks
from turbotrain.accel.precision import autocast_dtype
from turbotrain.distributed.env import ParallelConfig
from turbotrain.monitor.log import say


def apply_fsdp(model: nn.Module, device: torch.device, world_size: int, dtype: str, cfg: ParallelConfig) -> nn.Module:
    """Shard per block, then the root. Usage: `model = apply_fsdp(model, device, 8, "bf16", cfg)`."""
    mesh = init_device_mesh(device.type, (world_size,))
    param_dtype = autocast_dtype(dtype)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = find_blocks(model)
    if blocks is None:
        say("fsdp: no repeated blocks found; sharding the model as one unit")
    else:
        for i, block in enumerate(blocks):
            # the last block's params are needed again at once by backward: keep them gathered
            reshard = cfg.reshard_after_forward and i < len(blocks) - 1
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=cfg.reshard_after_forward)
    return model

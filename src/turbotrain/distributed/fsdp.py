"""FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded across ranks.

Units: with big blocks each repeated block is its own FSDP unit (its all-gather overlaps the previous
block's compute), then the root takes the rest. With small blocks the per-unit hooks cost more host time
than the block computes (GPT-2 124M: 7M parameters a block, FSDP per block ran at half DDP's speed), so
"auto" shards the whole model as one unit below BLOCK_PARAMS_FOR_UNITS parameters a block.
Mixed precision through MixedPrecisionPolicy: bf16/fp16 params for compute, fp32 gradient reduction (bf16
with parallel.grad_compression="bf16"), fp32 sharded master weights.
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


BLOCK_PARAMS_FOR_UNITS = 50_000_000


def per_block_units(model: nn.Module, setting: str) -> bool:
    """Whether each block becomes its own FSDP unit (decided before compile, which depends on it)."""
    blocks = find_blocks(model)
    if blocks is None or setting == "model":
        return False
    if setting == "blocks":
        return True
    return max(sum(p.numel() for p in b.parameters()) for b in blocks) >= BLOCK_PARAMS_FOR_UNITS


def apply_fsdp(model: nn.Module, device: torch.device, world_size: int, dtype: str, cfg: ParallelConfig) -> nn.Module:
    """Shard per block (or as one unit), then the root. Usage: `model = apply_fsdp(model, device, 8, "bf16", cfg)`."""
    mesh = init_device_mesh(device.type, (world_size,))
    param_dtype = autocast_dtype(dtype)
    reduce_dtype = torch.bfloat16 if cfg.grad_compression == "bf16" else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = find_blocks(model)
    if not per_block_units(model, cfg.fsdp_units):
        say("fsdp: sharding the model as one unit" + (" (no repeated blocks)" if blocks is None else
            f" (blocks under {BLOCK_PARAMS_FOR_UNITS / 1e6:.0f}M params; parallel.fsdp_units=\"blocks\" to shard each)"))
    else:
        for i, block in enumerate(blocks):
            # the last block's params are needed again at once by backward: keep them gathered
            reshard = cfg.reshard_after_forward and i < len(blocks) - 1
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=cfg.reshard_after_forward)
    return model

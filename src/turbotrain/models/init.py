"""Seeded per-parameter initialisation for the built-in models' `init_weights(seed)` hook (see
distributed/meta_init.py): each parameter's values come from its own generator seeded by (run seed, parameter
name) and are drawn whole on the host, one parameter at a time; a sharded (DTensor) parameter keeps its own
shard of them. So the values are the same whatever the build (meta or full size), the device or the sharding.

Usage, in a model: `for name, p in self.named_parameters(): normal_(p, seed, name, std=0.02)`.
"""
from __future__ import annotations

import zlib

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def seeded(seed: int, name: str) -> torch.Generator:
    """A CPU generator for one parameter: crc32 of (seed, name), the same in every process (unlike hash())."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))


@torch.no_grad()
def fill(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the whole-parameter values `full` (CPU) into `param`: all of it, or this rank's shard of it."""
    if param.is_meta:
        return
    if isinstance(param, DTensor):
        # src_data_rank=None: every rank cuts its own chunk from its own (identical) copy, no communication
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(full)


def normal_(param: torch.Tensor, seed: int, name: str, std: float) -> None:
    """N(0, std²) values of the whole parameter drawn on the host from (seed, name), this rank's part kept
    (nothing on the meta device: a meta build is initialised after `to_empty`)."""
    if param.is_meta:
        return
    fill(param, torch.empty(param.shape).normal_(0.0, std, generator=seeded(seed, name)))


def constant_(param: torch.Tensor, value: float) -> None:
    if param.is_meta:
        return
    with torch.no_grad():
        (param.to_local() if isinstance(param, DTensor) else param).fill_(value)

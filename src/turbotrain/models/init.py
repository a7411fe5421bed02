"""Seeded per-parameter initialisation for the built-in models' `init_weights(seed)` hook (see
distributed/meta_init.py). A parameter's values are drawn on the host in chunks of rows (dim 0), each chunk from
its own generator seeded by (run seed, parameter name, chunk): a sharded (DTensor) parameter draws only the
chunks its rows overlap. So the values are the same whatever the build (meta or full size), the device or the
sharding, host memory holds one chunk at a time, and a rank's host time scales with its shard, not the model.

Usage, in a model: `for name, p in self.named_parameters(): normal_(p, seed, name, std=0.02)`.
"""
from __future__ import annotations

import math
import zlib

import torch
from torch.distributed.tensor import DTensor

CHUNK_ELEMENTS = 1 << 20  # 4 MiB of fp32 drawn at a time (whole rows; a row longer than this is one chunk)


# path parts that wrappers add to parameter names (activation checkpointing, compile): a meta build is
# initialised after the techniques wrap it, a full-size build before, and both must draw the same values
WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def seeded(seed: int, name: str, chunk: int) -> torch.Generator:
    """A CPU generator for one chunk: crc32 of (seed, name without wrapper parts, chunk), the same in every
    process (unlike hash())."""
    for part in WRAPPER_PARTS:
        name = name.replace(part, "")
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}:{chunk}".encode()))


def local_rows(param: torch.Tensor) -> tuple[int, int]:
    """[start, stop) of dim 0 that this rank holds: all rows, or its Shard(0) chunks (torch.chunk's split, as
    DTensor and FSDP2 cut them) on each sharded mesh dimension in turn; Replicate keeps them."""
    start, length = 0, param.shape[0] if param.dim() else 1
    if isinstance(param, DTensor):
        for dim, pl in enumerate(param.placements):
            if pl.is_shard():
                if pl.dim != 0:
                    raise NotImplementedError(f"init: a parameter sharded on dim {pl.dim}")
                size = math.ceil(length / param.device_mesh.size(dim))
                cut = min(param.device_mesh.get_local_rank(dim) * size, length)
                start, length = start + cut, min(size, length - cut)
            elif not pl.is_replicate():
                raise NotImplementedError(f"init: a parameter placed as {pl}")
    return start, start + length


@torch.no_grad()
def normal_(param: torch.Tensor, seed: int, name: str, std: float) -> None:
    """N(0, std²) values of this rank's rows of the parameter, drawn chunk by chunk (see the module's doc)
    (nothing on the meta device: a meta build is initialised after `to_empty`)."""
    if param.is_meta:
        return
    local = param.to_local() if isinstance(param, DTensor) else param
    row_shape = tuple(param.shape[1:])
    rows = max(1, CHUNK_ELEMENTS // max(1, math.prod(row_shape)))  # rows a chunk
    a, b = local_rows(param)
    for c in range(a // rows, math.ceil(b / rows)):
        lo, hi = c * rows, min((c + 1) * rows, param.shape[0] if param.dim() else 1)
        chunk = torch.empty((hi - lo, *row_shape)).normal_(0.0, std, generator=seeded(seed, name, c))
        part = chunk[max(a, lo) - lo:min(b, hi) - lo]
        if param.dim():
            local[max(a, lo) - a:min(b, hi) - a].copy_(part)
        else:
            local.copy_(part.reshape(()))


def constant_(param: torch.Tensor, value: float) -> None:
    if param.is_meta:
        return
    with torch.no_grad():
        (param.to_local() if isinstance(param, DTensor) else param).fill_(value)

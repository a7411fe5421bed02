"""The `[parallel]` section and the choice of data parallelism (DDP or FSDP2) for a world size."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from turbotrain.errors import UserError


@dataclass
class ParallelConfig:
    strategy: Literal["auto", "none", "ddp", "fsdp", "hsdp", "pipeline"] = "auto"
    """"auto": ddp when WORLD_SIZE > 1, else none; ddp, fsdp (FSDP2), hsdp (FSDP2 on a 2-D mesh) and pipeline
    (one stage of blocks per rank) run under torchrun."""
    bucket_cap_mb: int = 100
    """DDP gradient bucket size; under compile each bucket also splits the graph, so fewer is faster."""
    static_graph: bool = False
    """DDP: the same graph every step (lets DDP skip the unused-parameter search)."""
    sync_batchnorm: bool = False
    """DDP: BatchNorm statistics over the global batch instead of each rank's micro-batch."""
    reshard_after_forward: bool = True
    """FSDP2: free a unit's gathered parameters after its forward (less memory, one more all-gather)."""
    fsdp_units: Literal["auto", "blocks", "model"] | int = "auto"
    """FSDP2 units: "model" (one), "blocks" (one per block), N runs of blocks; "auto": per block from 50M params
    a block."""
    straggler_ratio: float = 1.25
    """Warn when a rank's own time per step exceeds the others' median by this factor."""
    grad_compression: Literal["none", "bf16"] = "none"
    """Reduce gradients in bf16: half the bytes on the wire (helps FSDP2; DDP's hook loses to native buckets)."""
    pp_schedule: Literal["1f1b", "gpipe"] = "1f1b"
    """Pipeline schedule: "1f1b" (a chunk's backward as soon as it can: fewer activations held) or "gpipe"
    (all forwards, then all backwards)."""
    pp_microbatches: int = 0
    """Pipeline: chunks each micro-batch is split into (must divide data.batch_size); 0 = 2 x stages."""
    pp_stages: int = 0
    """Pipeline: stages (must divide the world); the world is stages x data-parallel groups, each stage's blocks
    sharded by FSDP2 over its group; 0 = every rank is a stage."""
    shard_size: int | None = None
    """HSDP: ranks per shard group (parameters sharded within it, replicated across groups); unset: the local
    world size (the GPUs of one node)."""
    meta_init: Literal["auto"] | bool = "auto"
    """Build the model on the meta device, shard/wrap it, then materialise and initialise it on the target
    device (it never exists whole on the host); "auto": on under fsdp/hsdp."""
    fsdp_prefetch: int = 1
    """FSDP2: all-gathers issued this many units ahead in forward and backward (explicit prefetch; more is more
    overlap and memory); 0 = torch's implicit prefetch."""

    def __post_init__(self) -> None:
        if self.bucket_cap_mb < 1:
            raise UserError(f"parallel.bucket_cap_mb = {self.bucket_cap_mb}: must be >= 1")
        if isinstance(self.fsdp_units, int) and self.fsdp_units < 1:
            raise UserError(f"parallel.fsdp_units = {self.fsdp_units}: a count of units must be >= 1")
        if self.pp_microbatches < 0:
            raise UserError(f"parallel.pp_microbatches = {self.pp_microbatches}: must be >= 1 (0 = 2 x stages)")
        if type(self.pp_stages) is not int or self.pp_stages < 0:
            raise UserError(f"parallel.pp_stages = {self.pp_stages!r}: a count of stages must be >= 0 "
                            "(0 = one stage a rank)")
        if self.shard_size is not None and (type(self.shard_size) is not int or self.shard_size < 1):
            raise UserError(f"parallel.shard_size = {self.shard_size!r}: a count of ranks must be >= 1")
        if self.meta_init not in ("auto", True, False):
            raise UserError(f"parallel.meta_init = {self.meta_init!r}: use \"auto\", true or false")
        if type(self.fsdp_prefetch) is not int or self.fsdp_prefetch < 0:
            raise UserError(f"parallel.fsdp_prefetch = {self.fsdp_prefetch!r}: a count of units must be >= 0 "
                            "(0 = torch's implicit prefetch)")
        if self.straggler_ratio <= 1:
            raise UserError(f"parallel.straggler_ratio = {self.straggler_ratio}: must be > 1")


SHARDED = ("fsdp", "hsdp")  # the FSDP2 strategies: sharded parameters, optimizer state and checkpoints


def fsdp_sharded(cfg: ParallelConfig, world_size: int) -> bool:
    """Whether FSDP2 shards the parameters: under fsdp/hsdp, and under pipeline with fewer stages than ranks
    (each stage sharded over its data-parallel group). cfg arrives resolved."""
    return cfg.strategy in SHARDED or (cfg.strategy == "pipeline" and 0 < cfg.pp_stages < world_size)


def hsdp_shape(world_size: int, shard_size: int | None, local_world_size: int) -> tuple[int, int]:
    """(replicas, shard group size) of the HSDP mesh; the world must be a whole number of shard groups."""
    shard = shard_size or local_world_size
    if shard > world_size or world_size % shard:
        raise UserError(f"parallel.shard_size = {shard}{' (the local world size)' if shard_size is None else ''}: "
                        f"WORLD_SIZE={world_size} must be a multiple of it; set parallel.shard_size to a divisor "
                        f"of {world_size}")
    return world_size // shard, shard


def resolve_strategy(strategy: str, world_size: int) -> str:
    """"auto" → ddp under torchrun, none alone; "none" with several ranks is refused."""
    if strategy == "auto":
        return "ddp" if world_size > 1 else "none"
    if strategy == "none" and world_size > 1:
        raise UserError(f"parallel.strategy = \"none\" with WORLD_SIZE={world_size}: use \"ddp\", \"fsdp\" or "
                        "\"hsdp\"")
    return strategy


def data_parallel(strategy: str, rank: int, world_size: int, pp_stages: int = 0) -> tuple[int, int]:
    """(data-parallel rank, data-parallel world size): under "pipeline" the world is a (stages, dp) grid,
    rank = stage x dp + dp coordinate; the stages of one dp group read the same batches, each dp group its own.
    pp_stages arrives resolved (0 only where the strategy is not "pipeline")."""
    if strategy != "pipeline":
        return rank, world_size
    dp = world_size // (pp_stages or world_size)
    return rank % dp, dp

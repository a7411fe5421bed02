"""The process group: read torchrun's environment, pick NCCL (GPU) or gloo (CPU), bind the device.

torchrun is the launcher (single- and multi-node, --max-restarts); nothing here spawns processes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

from turbotrain.errors import UserError

Strategy = Literal["auto", "none", "ddp", "fsdp"]


@dataclass
class ParallelConfig:
    strategy: Strategy = "auto"  # auto: ddp when WORLD_SIZE > 1, else none
    # DDP gradient bucket size. Under compile, dynamo also splits the graph at each bucket: 100 MB (torch's 25)
    # scaled GPT-2 124M 1->2 H200s at 96.5 % (25 MB: 94.0 %), the same per GPU as 250 MB (2026-11-22)
    bucket_cap_mb: int = 100
    static_graph: bool = False  # DDP: same graph every step (lets DDP skip unused-parameter search)
    sync_batchnorm: bool = False  # DDP: BatchNorm statistics over the global batch
    # FSDP2 units under the root: free a unit's gathered params after its forward (less memory, one more
    # all-gather in backward); the last unit and the root (the whole model with fsdp_units="model") stay gathered
    reshard_after_forward: bool = True
    # FSDP2 units: "model" (one), "blocks" (one per block), N (N runs of consecutive blocks), each then the
    # root; auto: per block once blocks reach 50M params, else one (GPT-2 124M on 2xH200: one unit fastest)
    fsdp_units: Literal["auto", "blocks", "model"] | int = "auto"
    straggler_ratio: float = 1.25  # warn when a rank's own time per step exceeds the others' median by this
    # gradients reduced in bf16: half the bytes on the wire, ~3 significant digits (DDP: comm hook; FSDP2: reduce
    # dtype). Measured on 2xH200, GPT-2 124M: FSDP2 +4 % per GPU; DDP 0.82x (the hook loses to native fp32 buckets)
    grad_compression: Literal["none", "bf16"] = "none"

    def __post_init__(self) -> None:
        if self.bucket_cap_mb < 1:
            raise UserError(f"parallel.bucket_cap_mb = {self.bucket_cap_mb}: must be >= 1")
        if isinstance(self.fsdp_units, int) and self.fsdp_units < 1:
            raise UserError(f"parallel.fsdp_units = {self.fsdp_units}: a count of units must be >= 1")
        if self.straggler_ratio <= 1:
            raise UserError(f"parallel.straggler_ratio = {self.straggler_ratio}: must be > 1")


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @staticmethod
    def from_environ() -> "DistEnv":
        e = os.environ
        return DistEnv(int(e.get("RANK", 0)), int(e.get("LOCAL_RANK", 0)), int(e.get("WORLD_SIZE", 1)),
                       int(e.get("LOCAL_WORLD_SIZE", e.get("WORLD_SIZE", 1))))


def resolve_strategy(strategy: str, world_size: int) -> str:
    if strategy == "auto":
        return "ddp" if world_size > 1 else "none"
    if strategy == "none" and world_size > 1:
        raise UserError(f"parallel.strategy = \"none\" with WORLD_SIZE={world_size}: use \"ddp\" or \"fsdp\"")
    return strategy


def init_distributed(env: DistEnv, device: torch.device) -> torch.device:
    """Join the process group (once) and return this rank's device (cuda:LOCAL_RANK on GPUs)."""
    if device.type == "cuda":
        if env.local_rank >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK {env.local_rank} but only {torch.cuda.device_count()} GPU(s) visible; "
                            f"lower --nproc_per_node")
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise UserError(f"parallel.strategy ddp/fsdp runs under torchrun ({', '.join(missing)} not set): "
                            "torchrun --nproc_per_node=N -m turbotrain train ...")
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=10),
                                device_id=device if device.type == "cuda" else None)
    return device


def all_mean(values: list[float], device: torch.device) -> list[float]:
    """Mean of each value over ranks (one collective for all of them)."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return (t / dist.get_world_size()).tolist()


def all_gather_floats(value: float, device: torch.device) -> list[float]:
    if not dist.is_initialized():
        return [value]
    t = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(x) for x in out]


def shutdown() -> None:
    """Leave the process group. DDP's reducers go first (see ddp.release_reducers: a deadlock otherwise)."""
    from turbotrain.distributed.ddp import release_reducers  # ddp imports this module

    release_reducers()
    if dist.is_initialized():
        dist.destroy_process_group()

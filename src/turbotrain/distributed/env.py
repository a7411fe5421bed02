"""The process group: read torchrun's environment, pick NCCL (GPU) or gloo (CPU), bind the device.

torchrun is the launcher (single- and multi-node, --max-restarts); nothing here spawns processes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from turbotrain.errors import UserError

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

"""One ordered model pipeline: every technique is applied to the model here, in one commented order, and
the result is what the train step needs (`Trainee`). The config arrives resolved (`resolve.py`): nothing
here rewrites a setting.

Adding a technique = its own module under accel/ or distributed/, one line in `apply_techniques`, one rule
in the resolver.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from turbotrain.accel import precision
from turbotrain.accel.activation_ckpt import MemoryConfig, apply_activation_checkpointing
from turbotrain.accel.compile import CompileConfig, apply_compile
from turbotrain.accel.memory_format import apply_channels_last
from turbotrain.accel.optim import build_optimizer, build_scheduler
from turbotrain.distributed import meta_init
from turbotrain.distributed.parallel import SHARDED, ParallelConfig
from turbotrain.losses import LossFn
from turbotrain.models.structure import WithLoss

if TYPE_CHECKING:
    from turbotrain.config import Config


@dataclass(kw_only=True)
class Trainee:
    """The model as trained and what steps it."""

    model: nn.Module  # wrapped by DDP / sharded by FSDP2 where asked
    step_module: nn.Module  # what a step calls: WithLoss(model), or DDP(WithLoss(model))
    compiled: list[nn.Module]  # compiled modules (emptied when compile falls back to eager)
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    dtype: str  # resolved precision.dtype
    device: torch.device


def apply_techniques(model: nn.Module, loss_fn: LossFn | None, device: torch.device, world: int, dtype: str,
                     mem: MemoryConfig, comp: CompileConfig, par: ParallelConfig,
                     seed: int = 0) -> tuple[nn.Module, nn.Module, list]:
    """(model, step_module, compiled) with every technique applied, in this order:
    1. TF32 switch: a process-wide matmul setting, fixed before anything runs.
    2. to the device: everything after works on the device's parameters. A meta model (parallel.meta_init)
       is materialised here unless FSDP2 shards it first (then right after 6: only its shard ever exists).
    3. channels_last: parameters in NHWC before compile traces them.
    4. activation checkpointing: wraps the block forwards, so compile (next) traces the recompute regions.
    5. per-block compile (scope="blocks"): before DDP/FSDP2 wrap the blocks, so each block is one graph.
    6. DDP or FSDP2. DDP wraps model + loss: dynamo breaks the graph at DDP's forward, so the loss stays with
       the head in the graph below.
    7. whole-model compile last, over the DDP-wrapped model + loss: dynamo splits the graph at bucket
       boundaries, so each bucket's all-reduce overlaps the rest of backward."""
    precision.apply_tf32(dtype)
    sharded_meta = par.meta_init and par.strategy in SHARDED
    if par.meta_init and not sharded_meta:
        meta_init.materialize(model, device, seed)
    model = model if sharded_meta else model.to(device)
    if mem.channels_last:
        model = apply_channels_last(model)
    apply_activation_checkpointing(model, mem.activation_checkpointing)
    compiled = apply_compile(model, comp) if comp.scope == "blocks" else []
    if par.strategy == "ddp":
        from turbotrain.distributed.ddp import apply_ddp

        model = step_module = apply_ddp(WithLoss(model, loss_fn), device, par)
    else:
        if par.strategy in SHARDED:
            from turbotrain.distributed.fsdp import apply_fsdp

            model = apply_fsdp(model, device, world, precision.autocast_dtype(dtype), par)
            if sharded_meta:
                meta_init.materialize(model, device, seed)
        step_module = WithLoss(model, loss_fn)
    if comp.scope == "model":
        compiled = apply_compile(step_module, comp)
    return model, step_module, compiled


def build_trainee(model: nn.Module, loss_fn: LossFn | None, cfg: Config, device: torch.device, world: int) -> Trainee:
    """Techniques, then the optimizer over the parameters as trained (sharded ones under FSDP2), the LR
    schedule and the fp16 loss scaler. Usage: `trainee = build_trainee(model, loss_fn, cfg, device, world)`."""
    dtype = cfg.precision.dtype
    model, step_module, compiled = apply_techniques(model, loss_fn, device, world, dtype, cfg.memory, cfg.compile,
                                                    cfg.parallel, cfg.run.seed)
    t = cfg.train
    opt = build_optimizer(model, t.optimizer, t.lr, t.weight_decay, device, t.optimizer_impl)
    if cfg.parallel.strategy in SHARDED:
        from turbotrain.distributed.fsdp import shard_local_step

        opt = shard_local_step(opt)
    return Trainee(model=model, step_module=step_module, compiled=compiled, opt=opt,
                   sched=build_scheduler(opt, t.warmup_steps, t.steps, t.schedule),
                   scaler=precision.build_scaler(dtype, device), dtype=dtype, device=device)

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
from turbotrain.accel.activation_ckpt import (
    MemoryConfig,
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)
from turbotrain.accel.compile import CompileConfig, apply_compile
from turbotrain.accel.convnet import set_convnet_kernels
from turbotrain.accel.fp8 import apply_fp8, remove_fp8
from turbotrain.accel.fused_loss import fused_linear_cross_entropy
from turbotrain.accel.memory_format import apply_channels_last
from turbotrain.accel.optim import build_optimizer, build_scheduler
from turbotrain.accel.weight_copies import apply_weight_copies, remove_weight_copies
from turbotrain.distributed import meta_init
from turbotrain.distributed.parallel import SHARDED, ParallelConfig, fsdp_sharded
from turbotrain.errors import UserError
from turbotrain.log import say_once
from turbotrain.losses import LossFn, cross_entropy
from turbotrain.models.structure import WithLoss, output_layer

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
                     seed: int = 0, *, fp8: str = "off", fp8_head: bool = False, fused_loss: bool = False,
                     convnet: bool = False, weight_copies: bool = False) -> tuple[nn.Module, nn.Module, list]:
    """(model, step_module, compiled) with every technique applied, in this order:
    1. TF32 switch: a process-wide matmul setting, fixed before anything runs.
    2. pipeline split (strategy="pipeline"): each rank keeps its stage of blocks before the device move, so
       only that stage reaches the device; 6 and 7 then wrap the stage's own blocks, and the schedule over the
       stage takes the place of DDP/FSDP2 in 8 (with parallel.pp_stages < world, FSDP2 shards the stage over
       its data-parallel group first, so the schedule runs the sharded stage).
    3. to the device: everything after works on the device's parameters. A meta model (parallel.meta_init)
       is materialised here unless FSDP2 shards it first (then right after 8: only its shard ever exists).
    4. FP8 linears (precision.fp8): after the move (no FP8 weight subclass is ever moved); before compile (dynamo
       fuses the amax/scale/cast ops into neighbouring kernels: FP8's gain depends on it), FSDP2 (it shards the
       FP8-aware weights, all-gathers them in FP8) and activation checkpointing (the swap sees plain blocks).
    5. channels_last, convnet layer rewrites, the linears' bf16 weight copies: before compile traces them.
    6. activation checkpointing: wraps the block forwards, so compile (next) traces the recompute regions.
    7. per-block compile (scope="blocks"): before DDP/FSDP2 wrap the blocks, so each block is one graph.
    8. DDP, FSDP2/HSDP or the pipeline schedule. DDP wraps model + loss: dynamo breaks the graph at DDP's
       forward, so the loss stays with the head in the graph below. The loss wrapper carries `fused_loss`:
       the head + cross-entropy as one chunked op (accel/fused_loss.py).
    9. whole-model compile last, over the DDP-wrapped model + loss: dynamo splits the graph at bucket
       boundaries, so each bucket's all-reduce overlaps the rest of backward."""
    if fused_loss and loss_fn is not cross_entropy:  # the resolver says so first; this guards direct callers
        raise UserError("kernels.fused_loss = true replaces the loss by the fused cross-entropy, but a loss "
                        "function was passed in code; drop it or set kernels.fused_loss=false")
    fused = fused_linear_cross_entropy if fused_loss else None
    precision.apply_tf32(dtype)
    if par.strategy == "pipeline":
        from turbotrain.distributed.pipeline_parallel import pp_mesh, split_model

        mesh = pp_mesh(device, world, par.pp_stages)
        model, ties = split_model(model, torch.distributed.get_rank(), world, par.pp_stages)
    sharded_meta = par.meta_init and par.strategy in SHARDED
    if par.meta_init and not sharded_meta:
        meta_init.materialize(model, device, seed)
    model = model if sharded_meta else model.to(device)
    apply_fp8(model, fp8, fsdp=fsdp_sharded(par, world), head=fp8_head)
    model = apply_channels_last(model) if mem.channels_last else model
    set_convnet_kernels(model, convnet, device)  # off: a model rewritten by an earlier run gets its layers back
    apply_weight_copies(model, weight_copies, skip=output_layer(model) if fused_loss else None)  # it reads the head
    apply_activation_checkpointing(model, mem.activation_checkpointing, comp.backend)
    compiled = apply_compile(model, comp) if comp.scope == "blocks" else []
    if par.strategy == "ddp":
        from turbotrain.distributed.ddp import apply_ddp

        model = step_module = apply_ddp(WithLoss(model, loss_fn, fused), device, par)
    elif par.strategy == "pipeline":
        model, step_module = _pipeline_schedule(model, ties, loss_fn, device, world, dtype, par, mesh)
    else:
        if par.strategy in SHARDED:
            from turbotrain.distributed.fsdp import apply_fsdp

            model = apply_fsdp(model, device, world, precision.autocast_dtype(dtype), par)
            if sharded_meta:
                meta_init.materialize(model, device, seed)
        step_module = WithLoss(model, loss_fn, fused)
    if comp.scope == "model":
        compiled = apply_compile(step_module, comp)
    return model, step_module, compiled


def give_back(model: nn.Module, device: torch.device, channels_last: bool) -> None:
    """The user's model as they built it, after a run (or a failed start): torch's own layers back (kernels.convnet,
    precision.weight_copies and precision.fp8 rewrite them in place), no activation-checkpoint wrappers, parameters
    contiguous again after channels_last."""
    set_convnet_kernels(model, False, device)
    remove_weight_copies(model)
    remove_fp8(model)
    remove_activation_checkpointing(model)
    if channels_last is True:
        model.to(memory_format=torch.contiguous_format)


def _pipeline_schedule(stage: nn.Module, ties: list, loss_fn: LossFn | None, device: torch.device, world: int,
                       dtype: str, par: ParallelConfig, mesh) -> tuple[nn.Module, nn.Module]:
    """(stage, its schedule runner): the stage FSDP2-sharded over the mesh's "dp" group first when there is one."""
    from turbotrain.distributed.pipeline_parallel import PipelineRunner

    if mesh is not None:
        from turbotrain.distributed.fsdp import apply_fsdp

        stage = apply_fsdp(stage, device, world, precision.autocast_dtype(dtype), par, mesh=mesh["dp"])
    return stage, PipelineRunner(stage, ties, loss_fn, device, par, mesh)


def _check_weight_dtypes(model: nn.Module, dtype: str) -> None:
    """Trainable weights in half precision (a model built with .half(), or loaded with dtype=torch.bfloat16)
    are stepped in that precision: no float32 master copy, small updates lost, and fp16's loss scaler refuses
    float16 gradients at the first step. precision.dtype sets the compute precision; the weights stay float32."""
    half = next(((n, p.dtype) for n, p in model.named_parameters()
                 if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16)), None)
    if half is None:
        return
    half, low = half
    if dtype == "fp16" and low == torch.float16:
        raise UserError(f"precision.dtype = \"fp16\" keeps float32 weights and runs the matmuls in fp16 under "
                        f"autocast, but the model's parameters are float16 (e.g. {half}): build the model in float32 "
                        f"(no .half()), or set precision.dtype = \"fp32\" to train the float16 weights as they are")
    say_once(f"warning: the model's trainable parameters are {str(low)[6:]} (e.g. {half}): the optimizer steps them "
             f"so, without float32 master weights (small updates are lost); build or load the model in float32 "
             f"(model.float()) and let precision.dtype = \"bf16\" run the matmuls in half precision")


def build_trainee(model: nn.Module, loss_fn: LossFn | None, cfg: Config, device: torch.device, world: int) -> Trainee:
    """Techniques, then the optimizer over the parameters as trained (sharded ones under FSDP2), the LR
    schedule and the fp16 loss scaler. Usage: `trainee = build_trainee(model, loss_fn, cfg, device, world)`."""
    dtype = cfg.precision.dtype
    _check_weight_dtypes(model, dtype)
    if isinstance(loss_fn, nn.Module):  # its buffers (CrossEntropyLoss's class weights) meet the outputs' device
        loss_fn.to(device)
    model, step_module, compiled = apply_techniques(model, loss_fn, device, world, dtype, cfg.memory, cfg.compile,
                                                    cfg.parallel, cfg.run.seed, fp8=cfg.precision.fp8,
                                                    fp8_head=cfg.precision.fp8_head,
                                                    fused_loss=cfg.kernels.fused_loss, convnet=cfg.kernels.convnet,
                                                    weight_copies=cfg.precision.weight_copies is True)
    t = cfg.train
    opt = build_optimizer(model, t.optimizer, t.lr, t.weight_decay, device, t.optimizer_impl)
    if fsdp_sharded(cfg.parallel, world):
        from turbotrain.distributed.fsdp import shard_local_step

        opt = shard_local_step(opt)
    return Trainee(model=model, step_module=step_module, compiled=compiled, opt=opt,
                   sched=build_scheduler(opt, t.warmup_steps, t.steps, t.schedule),
                   scaler=precision.build_scaler(dtype, device), dtype=dtype, device=device)

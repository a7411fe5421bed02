"""FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded across ranks.

Units: with big blocks each repeated block is its own FSDP unit, so its all-gather overlaps the previous
block's compute; with small blocks the per-unit hooks cost more host time than the block computes, so
"auto" shards the whole model as one unit below BLOCK_PARAMS_FOR_UNITS parameters a block (measured
figures: benchmarks/NOTES.md). `parallel.fsdp_units=N` is for models whose gathered parameters do not fit
at once: N units hold about 1/N of the blocks gathered at a time. `parallel.fsdp_prefetch` makes each unit
issue the next units' all-gathers explicitly (see `set_prefetch`).
HSDP (`parallel.strategy = "hsdp"`): the same units on a 2-D mesh ("replicate", "shard"): parameters are
sharded within a group of `parallel.shard_size` ranks (one node's GPUs: all-gathers stay on NVLink) and
replicated across groups (one all-reduce of the sharded gradients between nodes).
Mixed precision through MixedPrecisionPolicy: bf16/fp16 params for compute, fp32 gradient reduction (bf16
with parallel.grad_compression="bf16"), fp32 sharded master weights.

Host time matters at small sizes, because FSDP2's per-parameter DTensor work can exceed the GPU's work and
leave it idle. Three things cut it: the root stays gathered after forward, the optimizer steps on the
local shards (`shard_local_step`), and so does clipping (`accel/optim.py: clip_grad_norm`).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from turbotrain.distributed.parallel import ParallelConfig
from turbotrain.errors import UserError
from turbotrain.log import say
from turbotrain.models.structure import find_blocks

BLOCK_PARAMS_FOR_UNITS = 50_000_000


def unit_groups(model: nn.Module, setting: str | int) -> list[list[nn.Module]]:
    """The FSDP units under the root, as runs of consecutive blocks ([]: the model is one unit).
    setting: "model" (one unit), "blocks" (a unit per block), N (N units of about equal runs of blocks), or
    "auto" (a unit per block once blocks reach BLOCK_PARAMS_FOR_UNITS parameters, else one unit)."""
    blocks = find_blocks(model)
    if blocks is None or setting == "model":
        return []
    if setting == "auto":
        big = max(sum(p.numel() for p in b.parameters()) for b in blocks) >= BLOCK_PARAMS_FOR_UNITS
        n = len(blocks) if big else 1
    else:
        n = len(blocks) if setting == "blocks" else min(setting, len(blocks))
    if n <= 1:
        return []
    bounds = [round(i * len(blocks) / n) for i in range(n + 1)]
    return [list(blocks[a:b]) for a, b in zip(bounds, bounds[1:])]


def fsdp_mesh(device: torch.device, world_size: int, cfg: ParallelConfig) -> DeviceMesh:
    """1-D over every rank (fsdp), or 2-D (replicas, shard_size) for hsdp; shard_size arrives resolved."""
    if cfg.strategy != "hsdp":
        return init_device_mesh(device.type, (world_size,))
    shard = cfg.shard_size or world_size
    say(f"hsdp: {world_size // shard} replicas x {shard} ranks a shard group")
    return init_device_mesh(device.type, (world_size // shard, shard), mesh_dim_names=("replicate", "shard"))


def apply_fsdp(model: nn.Module, device: torch.device, world_size: int, param_dtype: torch.dtype | None,
               cfg: ParallelConfig, mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard each unit of blocks (or the model as one unit), then the root, over `mesh` (None: the strategy's,
    `fsdp_mesh`; a pipeline stage passes its data-parallel sub-mesh).
    Usage: `model = apply_fsdp(model, device, 8, torch.bfloat16, cfg)` (param_dtype None: fp32 compute)."""
    from turbotrain.distributed.ddp import has_batchnorm

    if cfg.sync_batchnorm and has_batchnorm(model):  # ignored, each rank's statistics would differ silently
        raise UserError(f"parallel.sync_batchnorm = true with parallel.strategy = \"{cfg.strategy}\": BatchNorm "
                        "statistics are synchronised under \"ddp\" only; use parallel.strategy=\"ddp\", or set "
                        "parallel.sync_batchnorm=false (each rank normalises by its own micro-batch)")
    mesh = mesh if mesh is not None else fsdp_mesh(device, world_size, cfg)
    reduce_dtype = torch.bfloat16 if cfg.grad_compression == "bf16" else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    groups = unit_groups(model, cfg.fsdp_units)
    if not groups:
        say("fsdp: sharding the model as one unit" + (" (no repeated blocks)" if find_blocks(model) is None else
            f" (blocks under {BLOCK_PARAMS_FOR_UNITS / 1e6:.0f}M params; "
            "parallel.fsdp_units=\"blocks\" or N for more)"))
    else:
        say(f"fsdp: {len(groups)} units of {'/'.join(str(len(g)) for g in groups)} blocks, then the root")
    for i, group in enumerate(groups):
        # the last unit's params are needed again at once by backward: keep them gathered
        reshard = cfg.reshard_after_forward and i < len(groups) - 1
        fully_shard(group if len(group) > 1 else group[0], mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    set_prefetch([g[0] for g in groups], cfg.fsdp_prefetch)
    # the root stays gathered after forward: backward needs it first (with one unit, resharding it would
    # all-gather the whole model twice a step, the second time with no compute to hide behind)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    if cfg.strategy in ("fsdp", "hsdp") and has_batchnorm(model):  # a pipeline stage's group is not the world
        model.register_forward_pre_hook(_eval_from_rank0)
    return model


def _eval_from_rank0(model: nn.Module, args: tuple) -> None:
    """Each eval forward uses rank 0's BatchNorm statistics (see ddp.rank0_running_stats: the checkpoints' and
    final/'s), a user's own eval forward too (step.evaluate takes them once for its own). Every FSDP2 forward is
    collective already (all-gathers), so no rank waits here alone; training normalises by the batch (and a
    compiled step keeps its one graph)."""
    if not model.training:
        from turbotrain.distributed.ddp import rank0_running_stats

        rank0_running_stats(model)


def set_prefetch(units: list[nn.Module], ahead: int) -> None:
    """Explicit prefetch: each unit (a module of it; a unit of several blocks shares one state) issues the
    all-gathers of the next `ahead` units in forward and of the previous `ahead` in backward, from the CPU as
    soon as its own all-gather is out, instead of torch's implicit one unit ahead found at run time.
    ahead 0, or fewer than two units: torch's implicit prefetch."""
    if ahead < 1 or len(units) < 2:
        return
    for i, unit in enumerate(units):
        if i + 1 < len(units):
            unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + ahead])
        if i > 0:
            unit.set_modules_to_backward_prefetch(units[max(0, i - ahead):i][::-1])
    say(f"fsdp: explicit prefetch {ahead} unit{'s' if ahead > 1 else ''} ahead (forward and backward)")


class _LocalShardStep:
    """Mixin for an elementwise optimizer (AdamW, Adam, SGD) over FSDP2's DTensor parameters: `step()` runs
    on the local shards, plain tensors that share storage with the parameters and the optimizer state, so the
    fused/foreach kernels skip DTensor's dispatch (on GPT-2's 148 parameters: 4.7 ms → 0.6 ms of host time a
    step on a CPU). The math is the same (each element is updated from its own gradient and state); the
    optimizer's state, `state_dict` and checkpoints stay DTensor-keyed. The first step runs on the DTensors
    (it creates the state); after a `load_state_dict` the views are rebuilt."""

    _views: tuple[list[list[torch.Tensor]], dict, list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    def _build_views(self) -> None:
        def local(t):
            return t._local_tensor if isinstance(t, DTensor) else t

        groups, state, pairs = [], {}, []
        for g in self.param_groups:
            locs = []
            for p in g["params"]:
                lp = local(p).detach()  # a leaf plain tensor on the same storage
                locs.append(lp)
                pairs.append((p, lp))
                if p in self.state:
                    state[lp] = {k: local(v) for k, v in self.state[p].items()}
            groups.append(locs)
        self._views = (groups, state, pairs)

    def step(self, *args, **kwargs):
        if self._views is None or len(self._views[1]) != len(self.state):
            if any(p not in self.state for g in self.param_groups for p in g["params"]):
                return super().step(*args, **kwargs)  # the first step creates the state (as DTensors)
            self._build_views()
        groups, state, pairs = self._views
        with torch.no_grad():
            for p, lp in pairs:
                lp.grad = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
        saved = [g["params"] for g in self.param_groups], self.state
        try:
            for g, locs in zip(self.param_groups, groups):
                g["params"] = locs
            self.state = state
            return super().step(*args, **kwargs)
        finally:
            for g, params in zip(self.param_groups, saved[0]):
                g["params"] = params
            self.state = saved[1]
            for _, lp in pairs:
                lp.grad = None

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._views = None


# Stepping each local shard alone is the same math only for optimizers that update every element from its
# own gradient and state; one that reads norms or shapes across a tensor (LAMB, Adafactor, Muon...) is not.
LOCAL_SHARD_OPTIMIZERS = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)


def shard_local_step(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The same optimizer object, stepping on local shards from now on (see `_LocalShardStep`), for the
    elementwise optimizers of LOCAL_SHARD_OPTIMIZERS; any other steps on the DTensors as torch does."""
    if type(opt) not in LOCAL_SHARD_OPTIMIZERS:
        say(f"fsdp: {type(opt).__name__} is not known to be elementwise; it steps on the sharded DTensors "
            "(correct, more host time) instead of the local shards")
        return opt
    opt.__class__ = type(f"ShardLocal{type(opt).__name__}", (_LocalShardStep, type(opt)), {})
    return opt

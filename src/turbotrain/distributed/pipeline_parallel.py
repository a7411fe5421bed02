"""Pipeline parallelism (`parallel.strategy = "pipeline"`): the built-in transformer split by blocks into one
stage per rank, run by a `torch.distributed.pipelining` schedule (1F1B or GPipe).

Every rank builds the whole model on the CPU from the same seed, then keeps only its stage: the embeddings
(first stage), a balanced run of blocks, the final norm and head (last stage). The stage holds the model's own
submodules under their original names (`blocks.5.qkv.weight` stays `blocks.5.qkv.weight`), so parameter names,
the optimizer's groups and the initial values are those of one process.

Tied parameters (GPT's head.weight is wte.weight) end up on two stages, each with its own copy: after
backward the copies' gradients are summed over the stages that hold them (Megatron's approach), so both
copies receive the one-process gradient, take the same optimizer step and stay equal.

With `parallel.pp_stages` below the world size the ranks form a 2-D mesh ("pp", "dp"), rank = stage x dp +
dp coordinate: each stage is sharded by FSDP2 over its "dp" group (ranks of one stage), the schedule runs
over each "pp" group (one rank of every stage, all with the same dp coordinate), and each dp group reads its
own batches. A tied parameter's copies are sharded alike on both stages, so the gradient sum runs shard by
shard, over the pp group of the stages holding it; the squares for the norm add up over the whole world.

The loss runs on the last stage; the schedule splits each micro-batch into `parallel.pp_microbatches` equal
chunks, and each chunk's loss is scaled by 1 / (chunks x grad_accum), so the summed gradients are the mean
over the global batch, as in one process. The step's loss is broadcast from the last stage to every rank.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from turbotrain.distributed.parallel import ParallelConfig
from turbotrain.errors import UserError
from turbotrain.log import say


def _gpt_embed(stage: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(idx.shape[1], device=idx.device)
    return stage.drop(stage.wte(idx) + stage.wpe(pos))


def _gpt_finish(stage: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return stage.head(stage.lnf(h))


class Layout:
    """What a model does around its blocks: the modules before them (first stage) and after (last stage),
    and the two functions that run them, as the model's own forward does."""

    def __init__(self, before: tuple[str, ...], after: tuple[str, ...], embed: Callable, finish: Callable):
        self.before, self.after, self.embed, self.finish = before, after, embed, finish


def layout_of(model: nn.Module) -> Layout | None:
    """The pipeline layout of a built-in transformer; None for any other model (its forward is unknown here)."""
    from turbotrain.models.gpt import GPT

    if type(model) is GPT:
        return Layout(("wte", "wpe", "drop"), ("lnf", "head"), _gpt_embed, _gpt_finish)
    return None


def stage_bounds(n_blocks: int, stages: int) -> list[tuple[int, int]]:
    """Balanced runs of blocks, one per stage: [(first block, end)] (the first stages get the spare blocks
    last, as `round` spreads them)."""
    cuts = [round(i * n_blocks / stages) for i in range(stages + 1)]
    return list(zip(cuts, cuts[1:]))


class StageModule(nn.Module):
    """One stage of the model: its parts under their original names. forward: token ids (first stage) or the
    previous stage's hidden states in; hidden states, or logits (last stage), out."""

    def __init__(self, model: nn.Module, layout: Layout, index: int, count: int, bounds: tuple[int, int]):
        super().__init__()
        self.index, self.count, self._layout = index, count, layout
        if index == 0:
            for name in layout.before:
                setattr(self, name, getattr(model, name))
        # Sequential keyed by the original indices: FQNs stay `blocks.<i>`; iterating and indexing still work
        self.blocks = nn.Sequential(OrderedDict((str(i), model.blocks[i]) for i in range(*bounds)))
        if index == count - 1:
            for name in layout.after:
                setattr(self, name, getattr(model, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index == 0:
            x = self._layout.embed(self, x)
        for block in self.blocks:
            x = block(x)
        return self._layout.finish(self, x) if self.index == self.count - 1 else x


def _stage_of_name(name: str, layout: Layout, bounds: list[tuple[int, int]]) -> int:
    top = name.split(".")[0]
    if top == "blocks":
        i = int(name.split(".")[1])
        return next(s for s, (a, b) in enumerate(bounds) if a <= i < b)
    if top in layout.before:
        return 0
    if top in layout.after:
        return len(bounds) - 1
    raise UserError(f"parallel.strategy = \"pipeline\": parameter {name} is neither in the blocks nor in the "
                    "model's embedding or head; this model cannot be split into stages")


def pp_mesh(device: torch.device, world: int, stages: int) -> DeviceMesh | None:
    """The ("pp", "dp") mesh of `stages` x world / stages ranks; None when every rank is a stage (no FSDP2).
    Collective: every rank calls it."""
    if stages in (0, world):
        return None
    return init_device_mesh(device.type, (stages, world // stages), mesh_dim_names=("pp", "dp"))


def split_model(model: nn.Module, rank: int, world: int, stages: int = 0) -> tuple[StageModule, list]:
    """This rank's stage (rank // dp, dp = world / stages; stages 0: one a rank), and its tied parameters as
    [(name in the stage, group, counted_here)]: `group` spans the ranks of this dp coordinate on the stages
    holding a copy; the norm counts the copy of the lowest stage only. Every rank calls this (the groups are
    created collectively, in the same order everywhere). Usage: `stage, ties = split_model(m, r, n, stages)`."""
    layout = layout_of(model)
    if layout is None:
        raise UserError(f"parallel.strategy = \"pipeline\": the model ({type(model).__name__}) is not a built-in "
                        "transformer; use parallel.strategy = \"ddp\" or \"fsdp\"")
    stages = stages or world
    dp = world // stages
    index, bounds = rank // dp, stage_bounds(len(model.blocks), stages)
    holders: dict[int, dict[int, str]] = {}  # parameter → {stage: its name there}
    for name, p in model.named_parameters(remove_duplicate=False):
        holders.setdefault(id(p), {}).setdefault(_stage_of_name(name, layout, bounds), name)
    groups: dict[tuple[int, ...], list] = {}
    ties = []
    for names in holders.values():
        key = tuple(sorted(names))
        if len(key) < 2:
            continue
        if key not in groups:  # new_group is collective: every rank creates every group, in the same order
            groups[key] = [dist.new_group([s * dp + d for s in key]) if len(key) < world else dist.group.WORLD
                           for d in range(dp)]
        if index in key:
            ties.append((names[index], groups[key][rank % dp], index == key[0]))
    say(f"pipeline: {stages} stages of {'/'.join(str(b - a) for a, b in bounds)} blocks"
        + (f", each sharded over {dp} ranks (FSDP2)" if dp > 1 else "")
        + (f"; {sum(len(n) > 1 for n in holders.values())} tied parameter(s) kept equal across stages"
           if groups else ""))
    return StageModule(model, layout, index, stages, bounds[index]), ties


def _local(t: torch.Tensor) -> torch.Tensor:
    """A gradient's own part: the local shard of an FSDP2 DTensor (the same storage), else the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


class PipelineRunner:
    """What a train step calls under pipeline parallelism: the schedule over this rank's stage (already on
    `device`), the tied gradients' reduction and the global gradient norm. Usage:
    `runner = PipelineRunner(stage, ties, loss_fn, device, par, mesh)`; `loss = runner.forward_backward(micro)`.
    mesh: the ("pp", "dp") mesh when the stage is FSDP2-sharded over "dp" (`pp_mesh`), else None."""

    def __init__(self, stage: StageModule, ties: list, loss_fn: Callable, device: torch.device, par: ParallelConfig,
                 mesh: DeviceMesh | None = None):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        params = dict(stage.named_parameters())
        self.ties = [(params[name], group, counted) for name, group, counted in ties]
        self.module, self.loss_fn, self.device = stage, loss_fn, device
        self.chunks, self.scale = par.pp_microbatches, 1.0
        self.first, self.last = stage.index == 0, stage.index == stage.count - 1
        # the schedule's sends, the tied sums and the loss broadcast stay within this rank's pp group
        self.group = mesh.get_group("pp") if mesh is not None else None
        self.last_rank = dist.get_global_rank(self.group, stage.count - 1) if mesh is not None else stage.count - 1
        self.dp_rank, self.dp_world = (mesh.get_local_rank("dp"), mesh.size(1)) if mesh is not None else (0, 1)
        self.stage = PipelineStage(stage, stage.index, stage.count, device, group=self.group)
        schedule = Schedule1F1B if par.pp_schedule == "1f1b" else ScheduleGPipe
        # scale_grads=False: the schedule would divide all of .grad, also what earlier micro-steps of an
        # accumulation left there; the loss carries the scale instead
        self.schedule = schedule(self.stage, self.chunks, loss_fn=self._loss, scale_grads=False)

    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(out, y) * self.scale

    def _run(self, run: Callable, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, list]:
        losses: list = []
        args = (x,) if self.first else ()
        kwargs = {"target": y, "losses": losses} if self.last else {}
        out = run(*args, **kwargs)
        return out, losses

    def forward_backward(self, micro_batches: list) -> torch.Tensor:
        """Forward and backward over the micro-batches of an accumulation, tied gradients reduced. Returns the
        mean loss over them, on every rank."""
        self.scale = 1.0 / (self.chunks * len(micro_batches))
        total = torch.zeros((), device=self.device)
        for x, y in micro_batches:
            _, losses = self._run(self.schedule.step, x, y)
            if losses:
                total += torch.stack([v.detach().float() for v in losses]).sum()
        for p, group, _ in self.ties:
            if p.grad is not None:  # shard by shard: the copies on both stages are sharded alike
                dist.all_reduce(_local(p.grad), group=group)
        dist.broadcast(total, src=self.last_rank, group=self.group)
        return total

    @torch.no_grad()
    def eval_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Forward only: (outputs, mean loss) on the last stage, (None, None) on the others."""
        self.scale = 1.0 / self.chunks
        out, losses = self._run(self.schedule.eval, x, y)
        if not self.last:
            return None, None
        return out, torch.stack([v.float() for v in losses]).sum()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The global L2 norm over every stage's gradients (a tied parameter counted once), and clipping to
        `max_norm` (inf: only the norm), as torch's clip_grad_norm_ over the whole model. The squares of
        every rank's own part add up over the world: stages hold different parameters, dp ranks different
        shards of them."""
        skip = {id(p) for p, _, counted in self.ties if not counted}
        grads = [_local(p.grad) for p in self.module.parameters() if p.grad is not None]
        counted = [_local(p.grad) for p in self.module.parameters() if p.grad is not None and id(p) not in skip]
        total_sq = torch.zeros((), device=self.device)
        if counted:
            total_sq = torch.stack(torch._foreach_norm(counted)).float().square().sum()
        dist.all_reduce(total_sq)
        total = total_sq.sqrt()
        if max_norm != math.inf and grads:
            torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return total


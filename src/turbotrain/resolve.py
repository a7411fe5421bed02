"""Resolve before you write: the requested config becomes the effective one — "auto" values, device facts,
data-derived model arguments and incompatible combinations — before `config.toml` is written, so the file
holds exactly what ran and re-running it reproduces the run. Each change of a value the user set is said
once, with its reason; a combination that cannot be resolved is refused with one `error:` line.

Adding a technique = its module, one line in `pipeline.apply_techniques`, one rule here.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, replace

import torch
from torch import nn

from turbotrain.accel.activation_ckpt import recomputes_in_graph
from turbotrain.accel.convnet import convnet_targets
from turbotrain.accel.weight_copies import candidates as copy_candidates
from turbotrain.config import Config, show_value
from turbotrain.errors import UserError
from turbotrain.log import say
from turbotrain.models import args_from_data
from turbotrain.models.gelu_epilogue import applies_in as gelu_applies_in
from turbotrain.models.gelu_epilogue import callers as gelu_callers
from turbotrain.models.packed_attention import callers
from turbotrain.models.structure import find_blocks, supports_fused_loss

RESIDENT_LIMIT_BYTES = 4 << 30  # "auto" keeps built-in datasets up to this size on the device


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What the machine, the data and the model say, as far as the config depends on it."""

    device: torch.device
    world_size: int = 1
    local_world_size: int = 1
    has_conv: bool = False
    block_params: tuple[int, ...] = ()  # parameters of each repeated block; () = no blocks
    data_args: dict | None = None  # data-derived model arguments the factory takes and the config leaves out
    in_memory_bytes: int | None = None  # a built-in in-memory dataset's size; None = a user dataset
    cpus: int = 1
    fused_loss_ready: bool = False  # the model has `hidden` and a bias-free `head` (models.structure)
    fused_loss_why: str | None = None  # why not, from running them (contract.fused_loss_problem); None: not run
    loss_in_code: bool = False  # the Python API was given a loss function other than the built-in cross-entropy
    pipeline_layout: bool = False  # a built-in transformer that pipeline parallelism can split into stages
    on_meta: bool = False  # the model was built on the meta device (parallel.meta_init)
    convnet_targets: int = 0  # stem-like convs and max pools kernels.convnet would rewrite
    qkv_attention: bool = False  # the model calls models.packed_attention.qkv_attention (kernels.packed_attention)
    attention_dropout: float = 0.0  # the largest dropout of those calls (the packed op runs without)
    gelu_mlp: bool = False  # the model calls models.gelu_epilogue.gelu_mlp (kernels.gelu_epilogue)
    gelu_mlp_applies: bool = False  # ... with linears the epilogues take (plain, biased, sizes of multiples of 8)
    fp32_params: bool = True  # every trainable parameter is float32 (the Triton AdamW kernel's)
    copy_linears: int = 0  # linears precision.weight_copies gives bf16 copies (accel/weight_copies.candidates)


def facts_of(device: torch.device, model: nn.Module, train_ds, data_args: dict, world: int = 1,
             local_world: int = 1, loss_in_code: bool = False, fused_loss_why: str | None = None) -> Facts:
    """Facts from a built (not yet parallelized) model and its training dataset."""
    from turbotrain.data.datasets import TensorDataset
    from turbotrain.distributed.pipeline_parallel import layout_of

    blocks = find_blocks(model)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Facts(device=device, world_size=world, local_world_size=local_world,
                 has_conv=any(isinstance(m, nn.Conv2d) for m in model.modules()),
                 block_params=tuple(sum(p.numel() for p in b.parameters()) for b in blocks) if blocks else (),
                 data_args=data_args, in_memory_bytes=train_ds.nbytes if isinstance(train_ds, TensorDataset) else None,
                 cpus=cpus, fused_loss_ready=supports_fused_loss(model) and fused_loss_why is None,
                 fused_loss_why=fused_loss_why, pipeline_layout=layout_of(model) is not None,
                 on_meta=any(p.is_meta for p in model.parameters()), loss_in_code=loss_in_code,
                 fp32_params=all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad),
                 convnet_targets=convnet_targets(model, device),
                 qkv_attention=bool(callers(model)),
                 attention_dropout=max((_dropout_of(m) for m in callers(model)), default=0.0),
                 gelu_mlp=bool(gelu_callers(model)), gelu_mlp_applies=gelu_applies_in(model),
                 copy_linears=len(copy_candidates(model)))


def _dropout_of(module: nn.Module) -> float:
    """A qkv_attention caller's `dropout`: a number, an nn.Dropout's p; anything else counts as some dropout."""
    d = getattr(module, "dropout", 0.0)
    d = d.p if isinstance(d, nn.Dropout) else d
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else 1.0


class _Changes:
    """Collects the effective values; says each change of an explicit setting once."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def set(self, section: str, key: str, value, why: str = "") -> None:
        old = getattr(getattr(self.cfg, section), key)
        if old == value:
            return
        if why:  # an explicit setting overridden (auto values resolve quietly; config.toml shows them)
            say(f"{section}.{key}: {show_value(old)} → {show_value(value)} ({why})")
        self.cfg = replace(self.cfg, **{section: replace(getattr(self.cfg, section), **{key: value})})


def resolve(cfg: Config, facts: Facts) -> Config:
    """The effective config for these facts. Usage: `cfg = resolve(cfg, facts_of(device, model, ds, args))`."""
    c = _Changes(cfg)
    on_gpu = facts.device.type == "cuda"
    _resolve_run(c, facts)
    _resolve_precision(c, facts)
    _resolve_parallel(c, facts)
    _resolve_compile(c, facts, on_gpu)
    _resolve_memory(c, facts)
    _resolve_data(c, facts, on_gpu)
    _resolve_optimizer(c, facts)
    _resolve_weight_copies(c, facts)
    _resolve_fused_loss(c, facts)
    _resolve_convnet(c, facts)
    _resolve_packed_attention(c, facts)
    _resolve_gelu_epilogue(c, facts)
    if c.cfg.kernels.attention == "auto" and not on_gpu:  # a GPU's is measured once the model is on it
        c.set("kernels", "attention", "default")
    if facts.data_args:
        c.set("model", "args", {**facts.data_args, **c.cfg.model.args})
    return c.cfg


def _resolve_run(c: _Changes, facts: Facts) -> None:
    if c.cfg.run.device == "auto":
        c.set("run", "device", facts.device.type)


def _resolve_precision(c: _Changes, facts: Facts) -> None:
    from turbotrain.accel.fp8 import check_fp8
    from turbotrain.accel.precision import resolve_dtype

    asked = c.cfg.precision.dtype
    if facts.device.type == "cpu" and asked in ("bf16", "fp16", "tf32"):
        say(f"warning: precision.dtype = \"{asked}\" on a CPU: "
            + ("tf32 is a GPU tensor-core mode and changes nothing here" if asked == "tf32" else
               "CPU autocast is usually slower than fp32 without native bf16/fp16 matmul units"))
    c.set("precision", "dtype", resolve_dtype(asked, facts.device),
          "" if asked == "auto" else "this GPU has no bf16; fp16 with loss scaling instead")
    if c.cfg.precision.fp8_head and c.cfg.precision.fp8 == "off":
        raise UserError("precision.fp8_head = true puts the head in FP8 with the other linears, but precision.fp8 "
                        "= \"off\"; set precision.fp8=\"tensorwise\" (or \"rowwise\"), or precision.fp8_head=false")
    if c.cfg.precision.fp8_head and c.cfg.kernels.fused_loss is True:  # a conflict: said before the device check
        raise UserError(f"kernels.fused_loss = true {_fused_loss_blocker(c.cfg, facts)}")
    check_fp8(c.cfg.precision.fp8, facts.device, c.cfg.precision.dtype)
    if c.cfg.precision.fp8 != "off" and not c.cfg.compile.enabled:
        say(f"warning: precision.fp8 = \"{c.cfg.precision.fp8}\" without compile.enabled: the FP8 casts run "
            "as separate kernels and may cost more than the FP8 matmuls save")


def _resolve_parallel(c: _Changes, facts: Facts) -> None:
    from turbotrain.distributed.fsdp import BLOCK_PARAMS_FOR_UNITS
    from turbotrain.distributed.parallel import SHARDED, resolve_strategy

    strategy = resolve_strategy(c.cfg.parallel.strategy, facts.world_size)
    c.set("parallel", "strategy", strategy)
    if strategy == "none" and c.cfg.parallel.grad_compression != "none":
        c.set("parallel", "grad_compression", "none", "one process has no gradients to reduce")
    if strategy == "hsdp":
        from turbotrain.distributed.parallel import hsdp_shape

        c.set("parallel", "shard_size", hsdp_shape(facts.world_size, c.cfg.parallel.shard_size,
                                                   facts.local_world_size)[1])
    else:  # set for another strategy, most likely meant for hsdp: said, not silently ignored
        c.set("parallel", "shard_size", None, f"shard groups are hsdp's; parallel.strategy is \"{strategy}\"")
    if strategy != "pipeline":
        c.set("parallel", "pp_microbatches", 0, f"pipeline chunks; parallel.strategy is \"{strategy}\"")
        c.set("parallel", "pp_stages", 0, f"pipeline stages; parallel.strategy is \"{strategy}\"")
    asked = c.cfg.parallel.meta_init
    c.set("parallel", "meta_init", facts.on_meta, "a model passed to train() is built already" if asked is True else "")
    if strategy in SHARDED and c.cfg.parallel.fsdp_units == "auto":
        big = bool(facts.block_params) and max(facts.block_params) >= BLOCK_PARAMS_FOR_UNITS
        c.set("parallel", "fsdp_units", "blocks" if big else "model")
    if strategy == "pipeline":
        _resolve_pipeline(c, facts)
    # one state.pt written by rank 0: its whole-model host copy would cost more than the write it hides
    if c.cfg.checkpoint.async_save and strategy not in (*SHARDED, "pipeline"):
        raise UserError(f"checkpoint.async_save = true with parallel.strategy = \"{strategy}\": async saves are for "
                        "sharded (DCP) checkpoints; use parallel.strategy=\"fsdp\", \"hsdp\" or \"pipeline\", or "
                        "checkpoint.async_save=false")


def _resolve_pipeline(c: _Changes, facts: Facts) -> None:
    """Stages of blocks on a (stages, dp) grid of ranks; what the stages cannot do is refused here, before any
    work."""
    stages, blocks, cfg = c.cfg.parallel.pp_stages or facts.world_size, len(facts.block_params), c.cfg
    why = "parallel.strategy = \"pipeline\""
    if facts.world_size < 2:
        raise UserError(f"{why} needs 2 or more ranks (one stage each): run it under torchrun --nproc_per_node=N")
    if cfg.parallel.pp_stages and (stages < 2 or stages > facts.world_size or facts.world_size % stages):
        raise UserError(f"parallel.pp_stages = {stages}: must be >= 2 and divide WORLD_SIZE={facts.world_size} "
                        "(the ranks are stages x data-parallel groups); 0 = one stage a rank")
    c.set("parallel", "pp_stages", stages)
    if not facts.pipeline_layout or not blocks:
        raise UserError(f"{why} splits the built-in transformer (model.name = \"gpt\") by its blocks; this model "
                        "is not one: use parallel.strategy = \"ddp\" or \"fsdp\"")
    if stages > blocks:
        raise UserError(f"{why} with {stages} stages: the model has {blocks} blocks, fewer than one a stage; "
                        f"use at most {blocks} stages (parallel.pp_stages) or more model.args.n_layer")
    if facts.world_size > stages and cfg.parallel.fsdp_units == "auto":  # FSDP2 shards each stage over its dp group
        from turbotrain.distributed.fsdp import BLOCK_PARAMS_FOR_UNITS

        c.set("parallel", "fsdp_units", "blocks" if max(facts.block_params) >= BLOCK_PARAMS_FOR_UNITS else "model")
    if cfg.train.loss == "model" or cfg.precision.dtype == "fp16":
        raise UserError(f"{why} needs the loss on the last stage and no fp16 loss scaling: set train.loss to a "
                        "loss function and precision.dtype to \"bf16\" or \"fp32\"")
    if cfg.checkpoint.final:
        c.set("checkpoint", "final", False, "each pipeline stage holds only its part of the model")
    asked, batch = cfg.parallel.pp_microbatches, cfg.data.batch_size
    chunks = asked or next((n for n in (2 * stages, stages) if batch % n == 0), stages)
    c.set("parallel", "pp_microbatches", chunks)
    if chunks < stages or batch % chunks:
        shown = f"{asked}" if asked else f"0 (auto: {chunks}, one a stage)"
        fits = next((n for n in range(stages, batch + 1) if batch % n == 0), None)
        chunks_fix = f"set parallel.pp_microbatches to a divisor of {batch} that is >= {stages} (e.g. {fits})"
        batch_fix = f"data.batch_size to a multiple of {max(asked, stages)}"
        fix = (f"{chunks_fix}, or {batch_fix}" if fits and asked >= stages else f"{chunks_fix}" if fits
               else f"set {batch_fix}")
        raise UserError(f"parallel.pp_microbatches = {shown}: needs >= {stages} (the stages) chunks that divide "
                        f"data.batch_size = {batch} equally; {fix}")


def _resolve_compile(c: _Changes, facts: Facts, on_gpu: bool) -> None:
    comp, par = c.cfg.compile, c.cfg.parallel
    if not comp.enabled:
        return
    if comp.backend != "inductor":  # torch.compile passes mode and options to inductor only
        why = f"an inductor setting; compile.backend is {show_value(comp.backend)}"
        c.set("compile", "mode", "default", why)
        c.set("compile", "coordinate_descent_tuning", False, why)
        c.set("compile", "inductor", {}, why.replace("setting", "settings table"))
        comp = c.cfg.compile
    if par.strategy == "pipeline" and comp.scope == "model":
        c.set("compile", "scope", "blocks", "under pipeline the schedule runs a stage's forward and backward per "
              "chunk between sends and receives: there is no whole-model forward to trace")
    if par.strategy != "none" and comp.mode == "reduce-overhead":
        c.set("compile", "mode", "default", "CUDA graphs cannot hold DDP/FSDP collectives")
    if comp.mode == "reduce-overhead" and not on_gpu:
        c.set("compile", "mode", "default", "CUDA graphs need a GPU")
    per_block_units = par.strategy in ("fsdp", "hsdp") and (
        par.fsdp_units == "blocks"
        or (isinstance(par.fsdp_units, int) and par.fsdp_units >= len(facts.block_params) > 1))
    if per_block_units and comp.scope == "model":
        c.set("compile", "scope", "blocks", "FSDP2 per-block units: a whole-model graph would break at every unit")


def _resolve_memory(c: _Changes, facts: Facts) -> None:
    mem = c.cfg.memory
    if mem.channels_last == "auto":
        c.set("memory", "channels_last", facts.device.type == "cuda" and facts.has_conv)
    if mem.activation_checkpointing != "none" and not facts.block_params:
        raise UserError("memory.activation_checkpointing needs a model with repeated blocks (a `blocks` ModuleList); "
                        "set memory.activation_checkpointing=\"none\"")
    comp = c.cfg.compile
    if mem.activation_checkpointing != "none" and comp.enabled and not recomputes_in_graph(comp.backend):
        why = (f"memory.activation_checkpointing under compile.backend = {show_value(comp.backend)}: that backend "
               "would recompute a block by rerunning its graph (BatchNorm's statistics updated twice, new dropout "
               "masks), so the checkpointed blocks run outside the graph")
        if comp.fullgraph:
            raise UserError(f"{why}, which compile.fullgraph = true forbids; set compile.backend=\"aot_eager\" "
                            "(or \"inductor\"), or compile.fullgraph=false")
        say(f"warning: {why} (a graph break at each); compile.backend=\"aot_eager\" keeps them in it")


def _resolve_data(c: _Changes, facts: Facts, on_gpu: bool) -> None:
    d = c.cfg.data
    if d.device_resident == "auto":
        c.set("data", "device_resident",
              facts.in_memory_bytes is not None and facts.in_memory_bytes <= RESIDENT_LIMIT_BYTES)
    elif d.device_resident and facts.in_memory_bytes is None:
        raise UserError("data.device_resident = true needs a built-in in-memory dataset; set it to \"auto\"")
    if d.num_workers == "auto":  # leave a core to the training process; past ~8 the IPC costs more
        c.set("data", "num_workers", max(0, min(8, facts.cpus // max(1, facts.local_world_size) - 1)))
    workers = c.cfg.data.num_workers
    if d.pin_memory == "auto" or not on_gpu:  # page-locked memory speeds host→GPU copies only
        c.set("data", "pin_memory", on_gpu, "" if d.pin_memory == "auto" else "no GPU to copy batches to")
    if not workers:  # batches are read in the training process: nothing prefetches them, whatever was set
        c.set("data", "prefetch_factor", "auto",
              "" if d.prefetch_factor == "auto" else "data.num_workers = 0: no worker processes to prefetch")
    elif d.prefetch_factor == "auto":
        c.set("data", "prefetch_factor", 4)
    if d.persistent_workers == "auto" or not workers:
        c.set("data", "persistent_workers", workers > 0,
              "" if d.persistent_workers == "auto" else "data.num_workers = 0: no worker processes to keep")


def _resolve_optimizer(c: _Changes, facts: Facts) -> None:
    from turbotrain.accel.optim import OPTIMIZERS, auto_impl
    from turbotrain.distributed.parallel import fsdp_sharded

    t = c.cfg.train
    if t.optimizer not in OPTIMIZERS:  # the user's factory picks its own kernels
        if t.optimizer_impl != "auto":
            c.set("train", "optimizer_impl", "auto", f"{t.optimizer} builds its own optimizer")
        return
    fused_ok = "fused" in inspect.signature(OPTIMIZERS[t.optimizer]).parameters
    device, sharded = facts.device, fsdp_sharded(c.cfg.parallel, facts.world_size)
    if t.optimizer_impl == "triton":
        from turbotrain.accel.triton_adamw import triton_problem

        problem = ("it is AdamW's kernel" if t.optimizer != "adamw" else "it does not step FSDP2's sharded "
                   "parameters" if sharded else triton_problem(device))
        if problem:
            raise UserError(f"train.optimizer_impl = \"triton\" with train.optimizer = {t.optimizer!r}: {problem}; "
                            "use optimizer_impl \"fused\" or \"auto\"")
    elif t.optimizer_impl == "auto":
        # the kernel takes contiguous float32 parameters: channels_last conv weights or half-precision ones would
        # build torch's fused AdamW anyway (accel/optim.triton_blocker), and config.toml says what runs
        nhwc = facts.has_conv and c.cfg.memory.channels_last is True
        c.set("train", "optimizer_impl", auto_impl(t.optimizer, device, sharded or nhwc or not facts.fp32_params))
    elif t.optimizer_impl == "fused" and not fused_ok:
        c.set("train", "optimizer_impl", "foreach", f"no fused {t.optimizer} kernel in this torch")


def _resolve_weight_copies(c: _Changes, facts: Facts) -> None:
    """"auto": on wherever the copies are exact and written (`_weight_copies_blocker`); an explicit true where they
    are not is an error."""
    setting = c.cfg.precision.weight_copies
    if setting is False:
        return
    blocker = _weight_copies_blocker(c.cfg, facts)
    if setting == "auto":
        c.set("precision", "weight_copies", blocker is None)
    elif blocker:
        raise UserError(f"precision.weight_copies = true {blocker}; set precision.weight_copies=false")


def _weight_copies_blocker(cfg: Config, facts: Facts) -> str | None:
    p, t = cfg.precision, cfg.train
    if p.dtype != "bf16":  # resolved by then
        return f"keeps bf16 copies for bf16 autocast, but precision.dtype = \"{p.dtype}\""
    if p.fp8 != "off":
        return f"keeps bf16 copies of the linears that precision.fp8 = \"{p.fp8}\" runs in FP8"
    if t.optimizer_impl != "triton":  # resolved by then
        return f"are written by the Triton AdamW kernel, but train.optimizer_impl = \"{t.optimizer_impl}\""
    if t.grad_accum != 1:
        return (f"is exact with one micro-batch a step, but train.grad_accum = {t.grad_accum} would sum bf16 "
                "gradients")
    if facts.world_size > 1:
        return f"is exact in one process, but {facts.world_size} processes would all-reduce bf16 gradients"
    if not facts.copy_linears:
        return ("copies plain nn.Linear layers with float32 trainable weights held by no other module; this model has "
                "none")
    return None


def _resolve_convnet(c: _Changes, facts: Facts) -> None:
    """"auto": on a GPU where the model has a layer to rewrite; true where it has none here is an error (on a CPU
    true rewrites stems only: the stem rewrite is exact there too, the max pools' kernels are GPU kernels)."""
    setting = c.cfg.kernels.convnet
    if setting == "auto":
        c.set("kernels", "convnet", facts.device.type == "cuda" and facts.convnet_targets > 0)
    elif setting and not facts.convnet_targets:
        raise UserError("kernels.convnet = true rewrites stride-2 convs over <= 4 channels and (on a GPU with "
                        f"triton) nn.MaxPool2d layers; this model has none to rewrite on {facts.device.type}; set "
                        "kernels.convnet=\"auto\" or false")


def _resolve_packed_attention(c: _Changes, facts: Facts) -> None:
    """"auto": on a Hopper or newer GPU (where torch's SDPA picks cuDNN's kernel too) for a model that calls
    qkv_attention, with cudnn-frontend importable and kernels.attention leaving cuDNN allowed; an explicit true
    where it cannot run is an error."""
    setting = c.cfg.kernels.packed_attention
    if setting is False:
        return
    blocker = _packed_attention_blocker(c.cfg, facts)
    if setting == "auto":
        hopper = (_capability(facts.device) or (0, 0))[0] >= 9
        only_the_install = hopper and blocker is not None and blocker.startswith("needs cudnn-frontend")
        c.set("kernels", "packed_attention", blocker is None and hopper, blocker if only_the_install else "")
    elif blocker:
        raise UserError(f"kernels.packed_attention = true {blocker}; set kernels.packed_attention=false")


def _capability(device: torch.device) -> tuple[int, int] | None:
    """A CUDA device's compute capability; None where this torch has no CUDA (facts of a GPU planned elsewhere)."""
    try:
        return torch.cuda.get_device_capability(device)
    except (AssertionError, RuntimeError):  # "Torch not compiled with CUDA enabled", no driver
        return None


def _packed_attention_blocker(cfg: Config, facts: Facts) -> str | None:
    from turbotrain.models.packed_attention import frontend_problem

    if facts.device.type != "cuda" or _capability(facts.device) is None:
        return f"runs cuDNN's attention kernel, which needs a CUDA GPU (this run is on {facts.device.type})"
    major, minor = _capability(facts.device)
    if major < 8:
        return f"runs cuDNN's fused attention, which needs an sm80+ GPU (this one is sm{major}{minor})"
    if not facts.qkv_attention:
        return ("applies to modules that call turbotrain.models.packed_attention.qkv_attention and say so with a "
                "class attribute `calls_qkv_attention = True` (turbotrain's GPT blocks do); this model has none")
    if cfg.kernels.attention in ("flash", "efficient", "math"):
        return f"runs cuDNN's attention kernel, but kernels.attention = \"{cfg.kernels.attention}\" disables it"
    if cfg.precision.dtype in ("fp32", "tf32"):  # resolved by then: "auto" is bf16 or fp16 on a GPU
        return f"runs in bf16 or fp16, but precision.dtype = \"{cfg.precision.dtype}\"; set precision.dtype=\"bf16\""
    if facts.attention_dropout > 0:
        return (f"runs attention without dropout, but the model's attention dropout is {facts.attention_dropout:g}"
                " (model.args.dropout); set it to 0")
    problem = frontend_problem()
    return f"needs {problem}" if problem else None


def _resolve_gelu_epilogue(c: _Changes, facts: Facts) -> None:
    """"auto": on a Hopper or newer GPU (where it was measured to pay) for a model that calls gelu_mlp, in
    bf16/fp16, and not under selective checkpointing (which would keep both GELU GEMM outputs, h and gelu(h), where
    the plain MLP keeps h alone); an explicit true where it cannot run is an error."""
    setting = c.cfg.kernels.gelu_epilogue
    if setting is False:
        return
    blocker = _gelu_epilogue_blocker(c.cfg, facts)
    if setting == "auto":
        hopper = (_capability(facts.device) or (0, 0))[0] >= 9
        selective = c.cfg.memory.activation_checkpointing == "selective"
        c.set("kernels", "gelu_epilogue", blocker is None and hopper and not selective)
    elif blocker:
        raise UserError(f"kernels.gelu_epilogue = true {blocker}; set kernels.gelu_epilogue=false")


def _gelu_epilogue_blocker(cfg: Config, facts: Facts) -> str | None:
    from turbotrain.models.gelu_epilogue import library_problem

    if facts.device.type != "cuda" or _capability(facts.device) is None:
        return f"runs cuBLASLt's GEMM epilogues, which need a CUDA GPU (this run is on {facts.device.type})"
    if not facts.gelu_mlp:
        return ("applies to modules that call turbotrain.models.gelu_epilogue.gelu_mlp and say so with a class "
                "attribute `calls_gelu_mlp = (\"fc\", \"out\")` naming the two linears (turbotrain's GPT blocks "
                "do); this model has none")
    if not facts.gelu_mlp_applies:
        return ("takes plain nn.Linear layers with biases and sizes of multiples of 8, named by the caller's "
                "`calls_gelu_mlp = (\"fc\", \"out\")` (two attribute names or dotted paths); no caller in this "
                "model names two such (every call would run the plain MLP)")
    if cfg.precision.fp8 != "off":
        return f"replaces the MLP's GEMMs, which precision.fp8 = \"{cfg.precision.fp8}\" runs in FP8 instead"
    if cfg.precision.dtype in ("fp32", "tf32"):  # resolved by then: "auto" is bf16 or fp16 on a GPU
        return f"runs in bf16 or fp16, but precision.dtype = \"{cfg.precision.dtype}\"; set precision.dtype=\"bf16\""
    problem = library_problem()
    return f"needs {problem}" if problem else None


def _resolve_fused_loss(c: _Changes, facts: Facts) -> None:
    """"auto" turns the fused loss on where it applies; an explicit true where it cannot is an error."""
    cfg = c.cfg
    if cfg.kernels.fused_loss is False:
        return
    blocker = _fused_loss_blocker(cfg, facts)
    if cfg.kernels.fused_loss == "auto":  # quiet, but for a model whose hidden/head names did not hold up
        c.set("kernels", "fused_loss", blocker is None, (facts.fused_loss_why or "").split("; set")[0])
    elif blocker:
        raise UserError(f"kernels.fused_loss = true {blocker}")


def _fused_loss_blocker(cfg: Config, facts: Facts) -> str | None:
    """Why the fused loss cannot run with this config and model (the rest of an error line), or None."""
    if not facts.fused_loss_ready:
        return facts.fused_loss_why or ("needs a model with `hidden(idx)` (final-normed hidden states) and a "
                                        "bias-free nn.Linear `head`; set kernels.fused_loss=false")
    if facts.loss_in_code:
        return "replaces the loss by the fused cross-entropy, but a loss function was passed in code; " \
               "drop it or set kernels.fused_loss=false"
    if cfg.train.loss != "cross_entropy":
        return (f"fuses the head with cross-entropy, not train.loss = {show_value(cfg.train.loss)}; "
                "set train.loss=\"cross_entropy\" or kernels.fused_loss=false")
    if cfg.parallel.strategy in ("fsdp", "hsdp"):
        return ("calls the model's `hidden` and `head` apart, which FSDP2's forward hooks do not cover; "
                "use parallel.strategy=\"ddp\" or kernels.fused_loss=false")
    if cfg.parallel.strategy == "pipeline":
        return ("cannot run under parallel.strategy=\"pipeline\": the last stage computes its loss from the "
                "logits; set kernels.fused_loss=false")
    if cfg.precision.fp8_head:
        return ("computes the head's matmul itself (in bf16), so precision.fp8_head would never run; "
                "set kernels.fused_loss=false")
    return None


def effective_config(cfg: Config) -> Config:
    """The config a `train` of `cfg` would run with, here and now, without training: builds the data and the
    model on the CPU to learn their facts. Usage: `print(to_toml(effective_config(cfg)))`."""
    from turbotrain.data.loader import build_dataset
    from turbotrain.distributed import meta_init
    from turbotrain.distributed.env import DistEnv
    from turbotrain.distributed.parallel import resolve_strategy
    from turbotrain.models import BUILTIN, build_model
    from turbotrain.prepare import check_host_memory
    from turbotrain.workload import data_meta, resolve_device

    env = DistEnv.from_environ()
    device = resolve_device(cfg.run.device)
    train_ds = build_dataset(cfg.data, "train")
    data_args = args_from_data(cfg.model, data_meta(train_ds))
    strategy = resolve_strategy(cfg.parallel.strategy, env.world_size)
    meta = meta_init.wanted(cfg.parallel.meta_init, strategy, cfg.model.name, BUILTIN)
    model_cfg = replace(cfg.model, args={**data_args, **cfg.model.args})
    check_host_memory(model_cfg, env.world_size if meta else 1)  # a typo of a size must not swap the host
    with meta_init.params_on_meta(meta):
        model = build_model(model_cfg)  # as prepare builds it
    return resolve(cfg, facts_of(device, model, train_ds, data_args, env.world_size, env.local_world_size))

"""`tune`'s search space: what the model and the device are (`Probe`), and the dimensions worth measuring
for them, in the order of their expected gain on that device.

Every candidate keeps the math: the same global batch (micro-batch × accumulation), LR, schedule and model.
Rounding may change (precision); FP8 changes the numerics more and is searched only when the user allows it
(`--allow-fp8`, or `--converge`, which re-checks the winner's loss). A lever that depends on the model or
the device applies where the resolver accepts the config with it set (`levers`): its rules, not a copy.
A dimension is a function of the search's state (`Ctx`), so its candidates are built on top of the best
configuration found so far and pruned with the memory estimate of the moment.

Usage: `probe, eff = probe_workload(cfg, nproc=1)`, then `for dim in dimensions(probe): dim.build(ctx)`.
"""
from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from torch import nn

from turbotrain.config import Config
from turbotrain.errors import UserError

CKPT_ACT_SHARE = {"none": 1.0, "selective": 0.6, "full": 0.25}  # activation memory kept per policy (rough)
OPT_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4}  # fp32 optimizer state per parameter
FIT_MARGIN = 0.92  # of device memory: the allocator's fragmentation and the CUDA context need the rest
COMPILE_GUESS_S = {"cpu": 45.0, "cuda": 60.0}  # a first compile, before any was measured
AUTOTUNE_COMPILE_FACTOR = 10  # max-autotune benchmarks kernel variants per op: many default compiles' time
# coordinate-descent tuning times inductor's pointwise and reduction kernels: cold compiles measured 3.1x (llama-1b),
# 4.3x (GPT-2 124M) and 6.4x (ResNet-50) the plain compile's, one H200
CDT_COMPILE_FACTOR = 6
MIX_ORDER = "triton.mix_order_reduction"  # inductor's LayerNorm/RMSNorm-backward fusion (recent torch): tried off
# keys whose change changes the rounding of the math
NUMERICS_KEYS = ("precision.dtype", "precision.fp8", "precision.fp8_head")
FP8_RECIPES = ("tensorwise", "rowwise")  # tensorwise first: 1.15x bf16 on llama-1b (H200), rowwise 1.01x
# tensorwise with the output layer in FP8 too: 1.07x tensorwise on llama-1b (H200); the fused loss would compute
# the head itself in bf16, so it is off
FP8_HEAD = {"precision.dtype": "bf16", "precision.fp8": "tensorwise", "precision.fp8_head": True,
            "kernels.fused_loss": False}
# the SDPA backends' hardware floors, as torch's sdp_utils checks them (cuDNN and flash: sm80+)
SDPA_MIN_CAPABILITY = {"cudnn": (8, 0), "flash": (8, 0), "efficient": (5, 0)}


@dataclass(frozen=True)
class Probe:
    """What decides which dimensions apply: the device, the model's structure and the data path."""

    on_gpu: bool
    bf16: bool
    world_size: int
    strategy: str
    has_conv: bool
    has_blocks: bool
    has_batchnorm: bool
    has_attention: bool
    in_memory: bool
    cpus: int
    builtin_optimizer: bool
    static_bytes: int  # parameters + gradients + optimizer state
    capacity_bytes: int  # device (or host) memory per process
    fused_loss: bool = False  # the resolver accepts kernels.fused_loss (model protocol, cross-entropy, not sharded)
    convnet: bool = False  # a GPU and a model with a layer kernels.convnet rewrites
    packed_attention: bool = False  # the resolver accepts kernels.packed_attention with bf16 (a GPU, the model, cuDNN)
    gelu_epilogue: bool = False  # the resolver accepts kernels.gelu_epilogue with bf16 (a GPU, the model, cuBLASLt)
    fp8: bool = False  # the resolver accepts precision.fp8 with bf16 (an FP8 GPU, torchao importable)
    fp8_head: bool = False  # ... and precision.fp8_head, and the model's output layer can be converted
    attention_backends: tuple[str, ...] = ()  # explicit SDPA backends this GPU runs
    hsdp_shards: tuple[int, ...] = ()  # HSDP shard-group sizes (1 < size < world) the resolver accepts
    micro_batch_math: str | None = None  # why a micro-batch change would change the math (None: it would not)


@dataclass(frozen=True)
class Candidate:
    label: str
    changes: dict[str, Any]  # dotted key → value, relative to the input config
    compile: bool = False  # costs a compile: budgeted apart
    compile_factor: float = 1.0  # that compile's expected time, in plain compiles
    est_mem_gib: float | None = None
    skip: str | None = None  # a reason not to run it (the memory estimate says it cannot fit)
    numerics: bool = False  # changes the numerics beyond rounding (FP8): only when the user allows it
    unless_slower: str | None = None  # pruned when this label (doing less of the same) measured slower


@dataclass(frozen=True)
class Dimension:
    name: str
    build: Callable[["Ctx"], list[Candidate]]
    monotone: bool = False  # ordered candidates: once one is slower than the one before, stop
    makes_fit: bool = False  # where the input config does not fit, this dimension comes first


@dataclass
class Ctx:
    """The search's state as a dimension sees it: the probe, the effective input config, the best changes so
    far and the activation memory per sample measured by the last trial without a memory error."""

    probe: Probe
    eff: Config
    best: dict[str, Any] = field(default_factory=dict)
    best_fits: bool = True  # False while nothing has run without running out of memory
    act_bytes_per_sample: float | None = None
    allow_fp16: bool = False
    allow_fp8: bool = False

    def value(self, key: str) -> Any:
        """A key's value in the best configuration so far (effective, "auto" resolved)."""
        if key in self.best:
            return self.best[key]
        section, name = key.split(".", 1)
        return getattr(getattr(self.eff, section), name)

    def differs(self, changes: dict[str, Any]) -> bool:
        return any(self.value(k) != v for k, v in changes.items())

    def estimate_gib(self, micro: int, ckpt: str) -> float | None:
        if self.act_bytes_per_sample is None:
            return None
        return (self.probe.static_bytes + self.act_bytes_per_sample * micro * CKPT_ACT_SHARE[ckpt]) / 2**30

    def fits(self, micro: int, ckpt: str) -> bool:
        est = self.estimate_gib(micro, ckpt)
        return est is None or est * 2**30 < self.probe.capacity_bytes * FIT_MARGIN * (1 - 1e-9)

    def learn_memory(self, peak_gib: float | None, micro: int, ckpt: str, oom: bool) -> None:
        """Activation bytes per sample from a trial's peak (the probe step); an OOM gives a lower bound."""
        static, cap = self.probe.static_bytes, self.probe.capacity_bytes
        if oom:
            floor = max(0.0, cap * FIT_MARGIN - static) / (micro * CKPT_ACT_SHARE[ckpt])
            self.act_bytes_per_sample = max(self.act_bytes_per_sample or 0.0, floor)
        elif peak_gib:
            self.act_bytes_per_sample = max(0.0, peak_gib * 2**30 - static) / (micro * CKPT_ACT_SHARE[ckpt])


# ---------------------------------------------------------------- the probe

def probe_workload(cfg: Config, nproc: int = 1) -> tuple[Probe, Config]:
    """Build the data and the model on the CPU (as `train` does before moving it) and resolve the config."""
    from turbotrain.accel.optim import OPTIMIZERS
    from turbotrain.data.loader import build_dataset
    from turbotrain.models import args_from_data, build_model
    from turbotrain.resolve import facts_of, resolve
    from turbotrain.workload import data_meta, resolve_device

    device = resolve_device(cfg.run.device)
    train_ds = build_dataset(cfg.data, "train")
    data_args = args_from_data(cfg.model, data_meta(train_ds))
    model = build_model(replace(cfg.model, args={**data_args, **cfg.model.args}))
    facts = facts_of(device, model, train_ds, data_args, nproc, nproc)
    eff = resolve(cfg, facts)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    on_gpu = device.type == "cuda"
    probe = Probe(on_gpu=on_gpu, bf16=on_gpu and torch.cuda.is_bf16_supported(), world_size=nproc,
                  strategy=eff.parallel.strategy, has_conv=facts.has_conv, has_blocks=bool(facts.block_params),
                  has_batchnorm=any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()),
                  has_attention=on_gpu and _uses_sdpa(model, train_ds), in_memory=facts.in_memory_bytes is not None,
                  cpus=facts.cpus, builtin_optimizer=eff.train.optimizer in OPTIMIZERS,
                  static_bytes=n_params * (8 + OPT_STATE_BYTES.get(eff.train.optimizer, 8)),
                  capacity_bytes=_capacity(device, nproc),
                  micro_batch_math=micro_batch_math(model, train_ds, cfg), **levers(cfg, eff, facts, model))
    return probe, eff


def levers(cfg: Config, eff: Config, facts, model: nn.Module) -> dict[str, Any]:
    """Which of the model- and device-dependent levers apply (Probe's fields of the same names): each where
    `resolve` accepts the requested config with it set, so the resolver's rules decide (fused loss: the
    model's `hidden` + bias-free `head`, cross-entropy, not under fsdp/hsdp/pipeline; FP8: an sm89+ GPU,
    bf16, torchao; the head in FP8: those, the fused loss off and an output layer FP8 can take; HSDP: a world
    that is a whole number of shard groups). Usage: `Probe(..., **levers(cfg, eff, facts, model))`."""
    from turbotrain.accel.fp8 import head_convertible
    from turbotrain.distributed.parallel import SHARDED, fsdp_sharded

    world, gpu = facts.world_size, facts.device.type == "cuda"
    shards = tuple(s for s in range(world - 1, 1, -1) if world % s == 0) if eff.parallel.strategy in SHARDED else ()
    fp8 = gpu and _accepts(cfg, facts, {"precision.dtype": "bf16", "precision.fp8": FP8_RECIPES[0]})
    return {"fused_loss": _accepts(cfg, facts, {"kernels.fused_loss": True}),
            "convnet": gpu and _accepts(cfg, facts, {"kernels.convnet": True}),
            "packed_attention": gpu and _accepts(cfg, facts, {"precision.dtype": "bf16",
                                                              "kernels.packed_attention": True}),
            "gelu_epilogue": gpu and _accepts(cfg, facts, {"precision.dtype": "bf16", "kernels.gelu_epilogue": True}),
            "fp8": fp8,
            "fp8_head": fp8 and _accepts(cfg, facts, FP8_HEAD) and head_convertible(
                model, fsdp_fp8_gather=fsdp_sharded(eff.parallel, world)),
            "attention_backends": _sdpa_backends(facts.device) if gpu else (),
            "hsdp_shards": tuple(s for s in shards if _accepts(cfg, facts, {"parallel.strategy": "hsdp",
                                                                          "parallel.shard_size": s}))}


def with_changes(cfg: Config, changes: dict[str, Any]) -> Config:
    """`cfg` with dotted keys set: `with_changes(cfg, {"kernels.fused_loss": True})`."""
    for key, value in changes.items():
        section, name = key.split(".", 1)
        cfg = replace(cfg, **{section: replace(getattr(cfg, section), **{name: value})})
    return cfg


def _accepts(cfg: Config, facts, changes: dict[str, Any]) -> bool:
    """Does the resolver accept `cfg` with `changes`? Quietly: its notes are for the trial that runs it."""
    from turbotrain.resolve import resolve

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            resolve(with_changes(cfg, changes), facts)
    except UserError:
        return False
    return True


def micro_batch_math(model: nn.Module, ds, cfg: Config) -> str | None:
    """Why splitting the global batch into other micro-batches would change the math, or None. The global batch
    is kept, so the math is kept only where each sample's output ignores the rest of its micro-batch and the
    loss is a mean over the samples (train divides each micro-batch's loss by the accumulation). BatchNorm
    breaks the first by design; a user model or loss can break either (a batch mean in forward, in-batch
    negatives, a summed loss): measured on two 2-sample batches that share their first sample."""
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return "the model has BatchNorm (its statistics are the micro-batch's)"
    if ":" not in cfg.model.name + cfg.train.loss:  # built-in models and losses are per sample (BatchNorm aside)
        return None
    try:
        return _coupling(model, ds, cfg.train.loss)
    except Exception:  # noqa: BLE001 - a probe only: a model that cannot run this way is for the trials to report
        return None


def _coupling(model: nn.Module, ds, loss_name: str) -> str | None:
    from torch.utils.data import default_collate

    from turbotrain.losses import resolve_loss
    from turbotrain.models.structure import own_loss

    loss_fn = resolve_loss(loss_name)
    if len(ds) < 3:
        return None
    (x, y), x2 = default_collate([ds[0], ds[1]]), default_collate([ds[0], ds[len(ds) - 1]])[0]
    model.train()
    for m in model.modules():  # the same masks either way: dropout is per element, never across samples
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.eval()

    def run(*args):
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            return model(*args)

    def close(a, b) -> bool:
        return torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-5, equal_nan=True)

    if loss_fn is None:  # the model returns the loss of (x, y): a pair's must be the mean of its samples'
        whole, parts = own_loss(run(x, y)), [own_loss(run(x[i:i + 1], y[i:i + 1])) for i in (0, 1)]
        return None if close(whole, (parts[0] + parts[1]) / 2) else \
            "the model's own loss is not the mean of its samples' losses (a sum, or a batch statistic)"
    out, out2 = run(x), run(x2)
    if not (isinstance(out, torch.Tensor) and out.dim() and out.shape[0] == 2):
        return None
    if not close(out[0], out2[0]):
        return "each sample's output depends on the other samples of its micro-batch (a batch statistic in forward)"
    halves = (loss_fn(out[:1], y[:1]) + loss_fn(out[1:], y[1:])) / 2
    return None if close(loss_fn(out, y), halves) else \
        f"train.loss = {loss_name!r} is not a mean over the samples (a sum, or a batch statistic): it follows the " \
        "micro-batch"


def _sdpa_backends(device: torch.device) -> tuple[str, ...]:
    cap = torch.cuda.get_device_capability(device)
    return tuple(b for b, need in SDPA_MIN_CAPABILITY.items() if cap >= need)


def _capacity(device: torch.device, nproc: int) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, nproc)


def _uses_sdpa(model: nn.Module, ds) -> bool:
    """Does one CPU forward of one sample call scaled_dot_product_attention (the op kernels.attention picks
    a backend for)? A model that cannot run this way counts as no."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class Seen(TorchFunctionMode):
        hit = False

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Seen.hit = Seen.hit or func is F.scaled_dot_product_attention
            return func(*args, **(kwargs or {}))

    try:
        x, y = ds[0]
        with torch.no_grad(), Seen():
            try:
                model(x.unsqueeze(0))
            except TypeError:  # a model that takes (x, y) and returns its loss
                model(x.unsqueeze(0), y.unsqueeze(0))
    except Exception:  # noqa: BLE001 - a probe only; the trials will say what is wrong
        return False
    return Seen.hit


# ---------------------------------------------------------------- the dimensions

def dimensions(probe: Probe) -> list[Dimension]:
    """Dimensions in order of expected gain: on a GPU precision and compile first; on a CPU the data path
    first (a CPU has no tensor cores, and a compile costs tens of seconds: it comes last)."""
    dims = {"precision": Dimension("precision", _precision), "compile": Dimension("compile", _compile),
            "memory": Dimension("micro-batch x accumulation, checkpointing", _memory, makes_fit=True),
            "data": Dimension("data path", _data, monotone=True), "loader": Dimension("loader", _loader),
            "optimizer": Dimension("optimizer kernel", _optimizer),
            "channels_last": Dimension("channels_last", _channels_last),
            "attention": Dimension("attention backend", _attention), "parallel": Dimension("parallel", _parallel),
            "autotune": Dimension("compiler kernel tuning", _autotune), "fp8": Dimension("fp8", _fp8),
            "fused_loss": Dimension("fused loss", _fused_loss), "convnet": Dimension("convnet kernels", _convnet),
            "packed_attention": Dimension("packed attention", _packed_attention),
            "gelu_epilogue": Dimension("GELU in GEMM epilogues", _gelu_epilogue)}
    order = (["precision", "compile", "fp8", "channels_last", "convnet", "optimizer", "attention", "packed_attention",
              "gelu_epilogue", "fused_loss",
              "memory", "data", "loader", "parallel", "autotune"] if probe.on_gpu else
             ["data", "loader", "optimizer", "fused_loss", "memory", "precision", "channels_last", "parallel",
              "compile"])
    return [dims[k] for k in order]


def _only_new(ctx: Ctx, cands: list[Candidate]) -> list[Candidate]:
    return [c for c in cands if ctx.differs(c.changes)]


def _precision(ctx: Ctx) -> list[Candidate]:
    p = ctx.probe
    if not p.on_gpu:  # CPU autocast is usually slower: one trial says so cheaply (or, from bf16, that fp32 is faster)
        return _only_new(ctx, [Candidate(n, {"precision.dtype": n}) for n in ("bf16", "fp32")])
    names = (["bf16"] if p.bf16 else []) + ["tf32"] + (["fp16"] if not p.bf16 or ctx.allow_fp16 else [])
    return _only_new(ctx, [Candidate(n, {"precision.dtype": n}) for n in names])


def _fp8(ctx: Ctx) -> list[Candidate]:
    """FP8 matmuls (on bf16): numerics change beyond rounding, so only when allowed; after compile, which
    fuses the FP8 casts (eager, they may cost more than the FP8 matmuls save)."""
    if not (ctx.probe.fp8 and ctx.allow_fp8):
        return []
    plain = {"precision.fp8_head": False} if ctx.value("precision.fp8_head") else {}
    cands = [Candidate(f"fp8 {r}", {"precision.dtype": "bf16", "precision.fp8": r, **plain}, numerics=True)
             for r in FP8_RECIPES]
    if ctx.probe.fp8_head:
        cands.insert(1, Candidate("fp8 tensorwise + head", FP8_HEAD, numerics=True))
    return _only_new(ctx, cands)


def _fused_loss(ctx: Ctx) -> list[Candidate]:
    """The head and cross-entropy as one chunked op, as a speed candidate (on, or off where the input has it
    on); as a memory lever it is tried again in the memory dimension, before checkpointing."""
    if not ctx.probe.fused_loss or ctx.value("precision.fp8_head"):  # the FP8 head needs it off
        return []
    on = not ctx.value("kernels.fused_loss")
    return [Candidate(f"fused loss {'on' if on else 'off'}", {"kernels.fused_loss": on})]


def _packed_attention(ctx: Ctx) -> list[Candidate]:
    """cuDNN's attention writing the qkv gradient in place (bf16/fp16 only): on, or off where the input has it on."""
    if not ctx.probe.packed_attention or ctx.value("precision.dtype") not in ("bf16", "fp16"):
        return []
    on = not ctx.value("kernels.packed_attention")
    return [Candidate(f"packed attention {'on' if on else 'off'}", {"kernels.packed_attention": on})]


def _gelu_epilogue(ctx: Ctx) -> list[Candidate]:
    """GELU and its gradient in cuBLASLt's GEMM epilogues (bf16/fp16 only): on, or off where the input has it on."""
    if not ctx.probe.gelu_epilogue or ctx.value("precision.dtype") not in ("bf16", "fp16"):
        return []
    on = not ctx.value("kernels.gelu_epilogue")
    return [Candidate(f"GELU epilogue {'on' if on else 'off'}", {"kernels.gelu_epilogue": on})]


def _compile_changes(mode: str, scope: str) -> dict[str, Any]:
    return {"compile.enabled": True, "compile.mode": mode, "compile.scope": scope}


def _compile(ctx: Ctx) -> list[Candidate]:
    p = ctx.probe
    cands = [Candidate("compile", _compile_changes("default", "model"), compile=True)]
    if p.on_gpu and p.world_size == 1:  # CUDA graphs first: for most models on one GPU the larger gain
        cands.insert(0, Candidate("compile + CUDA graphs", _compile_changes("reduce-overhead", "model"), compile=True))
    if p.has_blocks:
        cands.append(Candidate("compile per block", _compile_changes("default", "blocks"), compile=True))
    if ctx.value("compile.enabled"):  # the input compiles: eager may be faster (graph breaks, a small model, a CPU)
        cands.insert(0, Candidate("no compile (eager)", {"compile.enabled": False}))
    return _only_new(ctx, cands)


def _autotune(ctx: Ctx) -> list[Candidate]:
    """The compiler tuning its own kernels, last, on the best compile so far: first inductor's mix-order
    reduction off (one plain compile; its fused norm backward is faster for some models, slower for others),
    then coordinate-descent tuning of inductor's pointwise and reduction kernels (ResNet-50 +6 %, GPT-2 +0.4 %,
    one H200), then max-autotune's GEMM templates (without CUDA graphs); each of the last two costs several
    compiles."""
    from turbotrain.accel.compile import has_inductor_setting

    on = ctx.value("compile.enabled")
    mode, scope = (ctx.value("compile.mode"), ctx.value("compile.scope")) if on else ("default", "model")
    cands = []
    settings = ctx.value("compile.inductor")
    if settings.get(MIX_ORDER, True) and has_inductor_setting(MIX_ORDER):  # (this dimension runs on GPUs only)
        cands.append(Candidate("compile, inductor mix-order reduction off", {
            **_compile_changes(mode, scope), "compile.inductor": {**settings, MIX_ORDER: False}}, compile=True))
    cdt = {**_compile_changes(mode, scope), "compile.coordinate_descent_tuning": True}
    return _only_new(ctx, cands + [
        Candidate("compile + coordinate-descent tuning", cdt, compile=True, compile_factor=CDT_COMPILE_FACTOR),
        Candidate("compile max-autotune-no-cudagraphs", _compile_changes("max-autotune-no-cudagraphs", scope),
                  compile=True, compile_factor=AUTOTUNE_COMPILE_FACTOR)])


def _memory(ctx: Ctx) -> list[Candidate]:
    """Micro-batch × accumulation at the same global batch, and activation checkpointing; every candidate
    names all three keys. Where the best so far fits: larger micro-batches (fewer, fuller steps), each with
    the least checkpointing the estimate says fits. Checkpointing policies at the current micro-batch and
    smaller micro-batches only where memory is the problem: nothing fits yet, or the best so far
    checkpoints (less of it may fit). Where nothing fits yet, smaller micro-batches come first. The fused
    loss (no logits kept) is the lever before checkpointing: where it applies and is off, it comes first
    where memory is the problem, and before each larger micro-batch that would need checkpointing."""
    p, m0, ckpt0 = ctx.probe, ctx.value("data.batch_size"), ctx.value("memory.activation_checkpointing")
    per_device = m0 * ctx.value("train.grad_accum")
    policies = ["none", "selective", "full"] if p.has_blocks else ["none"]
    ok = [] if p.has_batchnorm or p.micro_batch_math else [
        m for m in (m0 * 8, m0 * 4, m0 * 2, m0 // 2, m0 // 4, m0 // 8) if 1 <= m <= per_device and per_device % m == 0]
    fused = p.fused_loss and not ctx.value("kernels.fused_loss") and not ctx.value("precision.fp8_head")
    larger = [c for m in ok if m > m0 for c in _micro_levers(ctx, m, per_device, policies[policies.index(ckpt0):],
                                                             fused)]
    tight = not ctx.best_fits or ckpt0 != "none"
    smaller = [_micro(ctx, m, per_device, ["none"]) for m in ok if m < m0] if tight else []
    at_m0 = [_micro(ctx, m0, per_device, [pol]) for pol in policies if pol != ckpt0] if tight else []
    if "selective" in policies:  # full recomputes more than selective: it cannot win where selective was slower
        at_m0 = [replace(c, unless_slower=next(x.label for x in at_m0 if "selective" in x.label))
                 if "full" in c.label and "selective" != ckpt0 else c for c in at_m0]
    # nothing fits: the same policy with the fused loss; checkpointing: one level less of it with the fused loss
    less = ckpt0 if not ctx.best_fits else policies[max(0, policies.index(ckpt0) - 1)]
    lever = [_fused_micro(ctx, m0, per_device, less)] if fused and tight else []
    return _only_new(ctx, lever + (larger + at_m0 + smaller if ctx.best_fits else smaller + at_m0 + larger))


def _micro(ctx: Ctx, m: int, per_device: int, policies: list[str]) -> Candidate:
    """Micro-batch `m` with the first of `policies` the memory estimate says fits."""
    changes = {"data.batch_size": m, "train.grad_accum": per_device // m}
    label = f"micro-batch {m} x accumulation {per_device // m}"
    fit = next((pol for pol in policies if ctx.fits(m, pol)), None)
    if fit is None:
        return Candidate(label, {**changes, "memory.activation_checkpointing": policies[-1]},
                         est_mem_gib=ctx.estimate_gib(m, policies[-1]), skip="the memory estimate says it does not fit")
    return Candidate(f"{label}, {fit} checkpointing", {**changes, "memory.activation_checkpointing": fit},
                     est_mem_gib=ctx.estimate_gib(m, fit))


def _micro_levers(ctx: Ctx, m: int, per_device: int, policies: list[str], fused: bool) -> list[Candidate]:
    """Micro-batch `m`: with the fused loss and the least checkpointing first where the estimate says `m`
    fits only with more checkpointing (the estimate does not know the fused loss's saving: it is measured)."""
    plain = _micro(ctx, m, per_device, policies)
    if not fused or plain.skip or plain.changes["memory.activation_checkpointing"] == policies[0]:
        return [plain]
    return [_fused_micro(ctx, m, per_device, policies[0]), plain]


def _fused_micro(ctx: Ctx, m: int, per_device: int, policy: str) -> Candidate:
    return Candidate(f"micro-batch {m} x accumulation {per_device // m}, fused loss, {policy} checkpointing",
                     {"data.batch_size": m, "train.grad_accum": per_device // m,
                      "memory.activation_checkpointing": policy, "kernels.fused_loss": True})


def _data(ctx: Ctx) -> list[Candidate]:
    """Device residency (no loader at all) for in-memory datasets, then DataLoader workers, most first:
    a host-bound loader shows its gain at once, and the counts go down only while fewer is faster
    (monotone: past the fastest count, fewer workers only starve the step)."""
    p = ctx.probe
    if p.in_memory:  # a tensor gather on the device: no copies, no IPC, nothing for workers to overlap
        return _only_new(ctx, [Candidate("device-resident data", {"data.device_resident": True})])
    out = []
    cap = max(4, min(8, 2 * p.cpus))  # sleeping or I/O-bound items overlap beyond the core count
    counts = [w for w in (8, 4, 2) if w <= cap]
    for w in counts:
        out.append(Candidate(f"{w} loader workers", {"data.device_resident": False, "data.num_workers": w,
                                                     "data.persistent_workers": True, "data.prefetch_factor": 4,
                                                     "data.pin_memory": p.on_gpu}))
    # last, reached only while fewer workers measured faster: cheap items load fastest in the training process
    out.append(Candidate("no loader workers", {"data.device_resident": False, "data.num_workers": 0,
                                               "data.persistent_workers": False, "data.prefetch_factor": "auto"}))
    return _only_new(ctx, out)


def _loader(ctx: Ctx) -> list[Candidate]:
    if ctx.value("data.device_resident") or not ctx.value("data.num_workers"):
        return []  # no DataLoader in the best path: nothing to refine
    out = [Candidate("prefetch 8 batches per worker", {"data.prefetch_factor": 8})]
    if ctx.probe.on_gpu:
        pin = not ctx.value("data.pin_memory")
        out.append(Candidate(f"pin_memory {str(pin).lower()}", {"data.pin_memory": pin}))
    return _only_new(ctx, out)


def _optimizer(ctx: Ctx) -> list[Candidate]:
    if not ctx.probe.builtin_optimizer:
        return []  # the user's factory picks its own kernels
    from turbotrain.accel.triton_adamw import triton_problem
    from turbotrain.distributed.parallel import fsdp_sharded

    # the resolver's rule: not over FSDP2's shards (DDP's replicas and whole pipeline stages are plain tensors)
    triton = (ctx.probe.on_gpu and not fsdp_sharded(ctx.eff.parallel, ctx.probe.world_size)
              and ctx.value("train.optimizer") == "adamw" and triton_problem(torch.device("cuda")) is None)
    # channels_last conv weights are not contiguous: there "triton" builds torch's fused AdamW (accel/optim.py's
    # triton_blocker), so a trial of one is a rerun of the other
    nhwc = ctx.probe.has_conv and ctx.value("memory.channels_last") is True

    def runs(impl: str) -> str:
        return "fused" if impl == "triton" and nhwc else impl
    now = runs(ctx.value("train.optimizer_impl"))
    return [Candidate(f"{impl} optimizer", {"train.optimizer_impl": impl})
            for impl in ("triton", "fused", "foreach")[0 if triton and not nhwc else 1:] if runs(impl) != now]


def _channels_last(ctx: Ctx) -> list[Candidate]:
    if not ctx.probe.has_conv:
        return []
    on = not ctx.value("memory.channels_last")
    return [Candidate(f"channels_last {str(on).lower()}", {"memory.channels_last": on})]


def _convnet(ctx: Ctx) -> list[Candidate]:
    """The stem as space-to-depth, the Triton max pool and the fused batch norm + ReLU + max pool
    (kernels.convnet): on, or off where the input has it."""
    if not ctx.probe.convnet:
        return []
    on = not ctx.value("kernels.convnet")
    return [Candidate(f"convnet kernels {'on' if on else 'off'}", {"kernels.convnet": on})]


def _attention(ctx: Ctx) -> list[Candidate]:
    """The measured pick ("auto": a micro-benchmark of the model's own SDPA calls) first, then each explicit
    backend end to end; only where the GPU runs several."""
    p = ctx.probe
    if not p.has_attention or len(p.attention_backends) < 2:
        return []
    return _only_new(ctx, [Candidate("attention auto (measured)", {"kernels.attention": "auto"}),
                           *(Candidate(f"{b} attention", {"kernels.attention": b}) for b in p.attention_backends)])


def _parallel(ctx: Ctx) -> list[Candidate]:
    p = ctx.probe
    if p.world_size < 2:
        return []
    if p.strategy in ("fsdp", "hsdp"):
        units = [Candidate(f"FSDP2 units {u}", {"parallel.fsdp_units": u}) for u in ("blocks", "model")]
        return _only_new(ctx, [*units, Candidate("FSDP2 keep gathered after forward",
                                                 {"parallel.reshard_after_forward": False}), *_hsdp(ctx)])
    return _only_new(ctx, [Candidate(f"DDP buckets {mb} MB", {"parallel.bucket_cap_mb": mb}) for mb in (25, 50, 200)])


def _hsdp(ctx: Ctx) -> list[Candidate]:
    """HSDP (sharded within groups, replicated across them: the all-gathers stay within a group) at each
    shard-group size smaller than the world, and plain FSDP2 (one group of all ranks) where the input is HSDP."""
    p = ctx.probe
    out = [Candidate(f"HSDP shard groups of {s} ({p.world_size // s} replicas)",
                     {"parallel.strategy": "hsdp", "parallel.shard_size": s}) for s in p.hsdp_shards]
    if p.strategy == "hsdp":
        out.append(Candidate("FSDP2 (one shard group)", {"parallel.strategy": "fsdp"}))
    return out

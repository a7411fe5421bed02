"""Optimizers (fused/foreach kernels) and the LR schedule (linear warmup, then cosine or constant)."""
from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from turbotrain.accel.weight_copies import copies_of, remove_weight_copies
from turbotrain.log import say, say_once

OPTIMIZERS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: biases and norm gains (1-D) are not decayed (GPT-2/nanoGPT practice)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def auto_impl(name: str, device: torch.device, sharded: bool = False) -> str:
    """What optimizer_impl "auto" takes: AdamW's Triton kernel on a GPU (one launch over every parameter, faster
    than torch's fused kernel: benchmarks/NOTES.md, session 29), except over FSDP2's sharded parameters; torch's
    fused kernel for the others on a GPU; foreach elsewhere."""
    from turbotrain.accel.triton_adamw import triton_problem

    if name == "adamw" and not sharded and triton_problem(device) is None:
        return "triton"
    return "fused" if "fused" in inspect.signature(OPTIMIZERS[name]).parameters and device.type == "cuda" \
        else "foreach"


def build_optimizer(
    model: nn.Module, name: str, lr: float, weight_decay: float, device: torch.device, impl: str = "auto"
) -> torch.optim.Optimizer:
    """`build_optimizer(model, "adamw", 3e-4, 0.1, device)`. impl "auto" is `auto_impl`'s; "triton" where a trainable
    parameter is not a float32 tensor on `device` runs torch's fused kernel instead, and says so. A
    "pkg.module:factory" name builds the user's optimizer: factory(param_groups, lr=lr, weight_decay=wd)."""
    if ":" in name:
        return _user_optimizer(model, name, lr, weight_decay)
    cls = OPTIMIZERS[name]
    kwargs: dict = {"lr": lr}
    if name == "sgd":
        kwargs["momentum"] = 0.9
    elif name in ("adam", "adamw"):
        kwargs["betas"] = (0.9, 0.95)
    fused_ok = "fused" in inspect.signature(cls).parameters and device.type in ("cuda", "cpu")
    if impl == "auto":
        impl = auto_impl(name, device)
    if impl == "triton":
        impl = _triton_or_fused(name, model, device)
    if impl == "fused" and not fused_ok:
        say(f"optimizer: fused {name} is not available here; using foreach")
        impl = "foreach"
    copies = copies_of(model)
    if copies and impl != "triton":  # only the Triton kernel writes them: the layers read their float32 weights
        remove_weight_copies(model)
        say(f"optimizer: {name} ({impl}) does not write the linears' bf16 weight copies (precision.weight_copies); "
            "the layers read their float32 weights, cast each step")
        copies = []
    if impl == "triton":
        from turbotrain.accel.triton_adamw import TritonAdamW

        opt = TritonAdamW(_param_groups(model, weight_decay), copies=copies, **kwargs)
        held = f", writing the bf16 copies of {len(copies)} weights and biases" if copies else ""
        say(f"optimizer: {name} (triton: one kernel over every parameter{held}), lr {lr:g}, weight decay "
            f"{weight_decay:g}")
        return opt
    if impl == "fused":
        kwargs["fused"] = True
    elif impl == "foreach":
        kwargs["foreach"] = True
    else:
        kwargs["foreach"] = False
    opt = cls(_param_groups(model, weight_decay), **kwargs)
    # torch's Adam and SGD add the decay to the gradient (an L2 penalty, which Adam then normalises): not AdamW's
    # decoupled decay, another update for the same train.weight_decay
    coupled = " (L2: added to the gradient, not decoupled as under adamw)" if weight_decay and name != "adamw" else ""
    say(f"optimizer: {name} ({impl}), lr {lr:g}, weight decay {weight_decay:g}{coupled}")
    return opt


def triton_blocker(name: str, model: nn.Module, device: torch.device) -> str | None:
    """Why optimizer_impl "triton" would not run its kernel for `model` (None: it would): it is AdamW's, on a GPU with
    triton, over plain contiguous float32 parameters. A half-precision parameter, a channels_last conv weight or an
    FSDP2 shard would hand every step to torch's foreach AdamW, slower than its fused one."""
    from turbotrain.accel.triton_adamw import triton_problem

    if name != "adamw":
        return f"train.optimizer = {name!r}: the kernel is AdamW's"
    if problem := triton_problem(device):
        return problem
    odd = next(((n, p) for n, p in model.named_parameters() if p.requires_grad and (  # "cuda" holds "cuda:0"
        p.dtype != torch.float32 or p.device.type != device.type or isinstance(p, DTensor)
        or not p.is_contiguous())), None)
    if odd is None:
        return None
    n, p = odd
    what = (f"{str(p.dtype)[6:]} on {p.device}{' (sharded)' if isinstance(p, DTensor) else ''}"
            if p.dtype != torch.float32 or p.device.type != device.type or isinstance(p, DTensor)
            else "not contiguous (channels_last?)")
    return f"it takes contiguous float32 parameters on {device}; {n} is {what}"


def _triton_or_fused(name: str, model: nn.Module, device: torch.device) -> str:
    """"triton", or (said) the kernel `auto_impl` takes where `triton_blocker` names a reason."""
    why = triton_blocker(name, model, device)
    if why is None:
        return "triton"
    fallback = auto_impl(name, device, sharded=True)  # anything but triton
    say(f"optimizer: the Triton AdamW kernel does not run here ({why}): {fallback} runs instead")
    return fallback


_KERNEL_FLAGS = ("foreach", "fused", "capturable")


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """`opt.load_state_dict(state)`, keeping this run's kernel (`keeping_kernel`)."""
    with keeping_kernel(opt):
        opt.load_state_dict(state)


@contextlib.contextmanager
def keeping_kernel(opt: torch.optim.Optimizer):
    """Around a load of `opt`'s state (its own load_state_dict, or DCP's set_state_dict for FSDP2): torch's load
    takes the saved groups' foreach/fused/capturable flags, so a checkpoint written under another
    train.optimizer_impl would switch the kernel (and a fused kernel would meet step counts kept on the host): the
    flags stay the built optimizer's, and the step counts move to where its kernel keeps them (the device for fused
    and capturable, else the host)."""
    flags = [{k: g[k] for k in _KERNEL_FLAGS if k in g} for g in opt.param_groups]
    try:
        yield
    finally:  # a load that failed half-way leaves the flags too: the next checkpoint tried must find this run's
        _restore_kernel(opt, flags)


def _restore_kernel(opt: torch.optim.Optimizer, flags: list[dict]) -> None:
    for group, kept in zip(opt.param_groups, flags):
        group.update(kept)
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            st = opt.state.get(p)
            step = st.get("step") if st else None
            if isinstance(step, torch.Tensor):
                device = (p.to_local() if isinstance(p, DTensor) else p).device if on_device else "cpu"
                st["step"] = step.detach().to(device, torch.float32 if on_device else step.dtype)


def _user_optimizer(model: nn.Module, spec: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    from turbotrain.errors import UserError
    from turbotrain.plugins import call_factory, load_object

    opt = call_factory(load_object(spec, "train.optimizer"), "train.optimizer", _param_groups(model, weight_decay),
                       lr=lr, weight_decay=weight_decay)
    if not isinstance(opt, torch.optim.Optimizer):
        raise UserError(f"train.optimizer = {spec!r}: the factory returned {type(opt).__name__}, not a "
                        "torch.optim.Optimizer")
    closure = inspect.signature(opt.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:  # LBFGS: re-evaluates the loss itself
        raise UserError(f"train.optimizer = {spec!r}: {type(opt).__name__}.step needs a closure that recomputes "
                        "the loss; turbotrain steps once per batch without one: use an optimizer like AdamW or SGD")
    if isinstance(opt, torch.optim.SparseAdam):
        raise UserError(f"train.optimizer = {spec!r}: SparseAdam takes only sparse gradients, and it must hold "
                        "every trainable parameter, dense ones too: use adam or adamw")
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    left = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if left:  # those would silently never train
        raise UserError(f"train.optimizer = {spec!r}: the optimizer it returned does not hold {len(left)} of the "
                        f"model's trainable parameters (e.g. {left[0]}); build it from the param_groups it is given")
    say(f"optimizer: {type(opt).__name__} from {spec}, lr {lr:g}, weight decay {weight_decay:g}")
    return opt


@torch.no_grad()  # DTensor.to_local with grad mode on goes through autograd: 30x slower
def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float,
                   opt: torch.optim.Optimizer | None = None) -> torch.Tensor:
    """L2 norm of all gradients, and clipping to `max_norm` (inf: only the norm), as torch's
    `clip_grad_norm_(foreach=True)` but on plain tensors: FSDP2's gradients are DTensors, and each DTensor op
    pays a sharding dispatch per tensor (host time; see benchmarks/NOTES.md, session 3). The
    squared norms of the local shards are summed over the ranks by one all-reduce, queued on the device
    (no host sync). Returns the total norm as a 0-d device tensor.

    Given the optimizer that steps next, and where it is one of torch's fused kernels (`folds_clip`), the clip
    is not a pass of its own: the coefficient goes to the kernel as `grad_scale` (it divides each gradient by it
    as it reads it, the hook torch's GradScaler uses), saving a read and a write of every gradient. The caller
    must step that optimizer next and must not be unscaling fp16 gradients through a GradScaler."""
    grad_of = getattr(opt, "grad_of", None) or (lambda p: p.grad)  # a copied weight's is its copy's (TritonAdamW)
    grads = [g for g in map(grad_of, params) if g is not None]
    if not grads:
        return torch.zeros(())
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    # no dtype argument, as torch's own clip: asking for fp32 norms here cost a DDP step several times what
    # torch's clip costs (benchmarks/NOTES.md, session 4); the norms are summed in fp32 below
    sq_sum = getattr(opt, "grad_sq_sum", None)  # TritonAdamW's one-kernel sum of squares, where it takes these
    total_sq = sq_sum(local) if sq_sum else None
    if total_sq is None:  # the copies' bf16 gradients are autocast's float32 ones before their cast: normed as those
        held = [g.float() if sq_sum and g.dtype is torch.bfloat16 else g for g in local]
        total_sq = torch.stack(torch._foreach_norm(held)).float().square().sum()
    sharded = [g for g in grads if isinstance(g, DTensor)]
    if sharded:  # FSDP2: Shard(0) DTensors; HSDP: (Replicate, Shard(0)) on a 2-D mesh
        placements = sharded[0].placements
        if len(sharded) != len(grads) or any(g.placements != placements for g in sharded) \
                or not any(pl.is_shard() for pl in placements):
            raise NotImplementedError("clip_grad_norm: mixed or unsharded DTensor gradients")
        mesh = sharded[0].device_mesh
        for dim, pl in enumerate(placements):  # the shards' squares add up; replicas hold the same ones
            if pl.is_shard():
                dist.all_reduce(total_sq, group=mesh.get_group(dim))
    total = total_sq.sqrt()
    if max_norm != math.inf:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if opt is not None and not sharded and folds_clip(opt):
            opt.grad_scale = 1.0 / coef
        else:
            torch._foreach_mul_(local, coef)
    return total


def folds_clip(opt: torch.optim.Optimizer) -> bool:
    """True for torch's fused Adam/AdamW/SGD: their kernels take a `grad_scale` tensor to divide gradients by."""
    from turbotrain.accel.triton_adamw import TritonAdamW

    return (type(opt) in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD) and bool(opt.defaults.get("fused"))
            or type(opt) is TritonAdamW)


def lr_lambda(step: int, warmup_steps: int, total_steps: int, schedule: str, min_ratio: float = 0.1) -> float:
    """Multiplier of the base LR at `step`: linear warmup, then cosine decay to `min_ratio` or constant."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(opt: torch.optim.Optimizer, warmup_steps: int, total_steps: int, schedule: str):
    if warmup_steps > total_steps:  # a short trial of a long run's config, often: said, since its LR differs
        say_once(f"warning: train.warmup_steps={warmup_steps} > train.steps={total_steps}: the LR rises for the "
                 f"whole run and peaks at {total_steps / warmup_steps:.0%} of train.lr")
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_lambda(s, warmup_steps, total_steps, schedule)
    )

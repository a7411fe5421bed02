"""One optimizer step and the evaluation pass (the `[train]` section configures them and the loop)."""
from __future__ import annotations

import math
import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import torch
from torch.utils.data import Dataset, default_collate

from turbotrain.accel import precision
from turbotrain.accel.compile import disable_compile, is_compile_error
from turbotrain.accel.fp8 import fp8_shape_error
from turbotrain.accel.optim import clip_grad_norm
from turbotrain.accel.weight_copies import drop_replaced
from turbotrain.contract import check_eval_value, metric_value
from turbotrain.data.datasets import TensorDataset
from turbotrain.data.loader import eval_batches
from turbotrain.distributed.ddp import DDP, grad_sync, rank0_running_stats
from turbotrain.distributed.env import DistEnv, all_mean
from turbotrain.distributed.pipeline_parallel import PipelineRunner
from turbotrain.errors import UserError
from turbotrain.log import say
from turbotrain.losses import cross_entropy, mse
from turbotrain.models.structure import own_loss
from turbotrain.monitor.phases import phase
from turbotrain.monitor.stragglers import ForwardTimer
from turbotrain.pipeline import Trainee
from turbotrain.plugins import call_user, factory_label, where


@dataclass
class TrainConfig:
    steps: int = 100
    """Optimizer steps to train for."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; global batch = data.batch_size x grad_accum x world size."""
    optimizer: str = "adamw"
    """"adamw" | "adam" (betas 0.9, 0.95) | "sgd" (momentum 0.9) | "pkg.module:factory"
    (factory(param_groups, lr=, weight_decay=))."""
    optimizer_impl: Literal["auto", "triton", "fused", "foreach", "for"] = "auto"
    """Optimizer kernel. "triton" (adamw on a GPU): one Triton launch updates every parameter, and one more sums the
    gradients' squares for the clip; the state is torch's own, so checkpoints move between the kernels. "fused":
    torch's fused kernel. "auto" takes triton for adamw on a GPU (fused under FSDP2, and said, where a parameter is
    not a contiguous float32 tensor: half precision, channels_last), fused for adam and sgd on a GPU, foreach
    elsewhere."""
    lr: float = 3e-4
    """Peak learning rate."""
    weight_decay: float = 0.1
    """Weight decay on matrices (biases and norm gains are not decayed): decoupled under adamw; adam and sgd add it
    to the gradient (L2), as torch's do."""
    warmup_steps: int = 0
    """Linear LR warm-up steps."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """LR after warm-up: cosine decay to 10 % of lr, or constant."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = off)."""
    loss: str = "cross_entropy"
    """"cross_entropy" | "mse" | "model" (forward(x, y) returns the loss: a tensor, or {"loss": ...} / .loss / (loss,
    ...) as HF Trainer and Accelerate loops read it) | "pkg.module:fn"."""
    eval_every: int = 0
    """Steps between evaluations (0 = only at the end)."""
    log_every: int = 10
    """Steps between logged metric rows (each costs one device sync)."""
    max_bad_steps: int = 3
    """Consecutive non-finite losses before the run stops."""
    callbacks: list[str] = field(default_factory=list)
    """Callbacks, as "pkg.module:Class" (built with no arguments): see turbotrain.callbacks.Callback."""
    eval_metrics: list[str] = field(default_factory=list)
    """Extra validation metrics, as "pkg.module:fn" with fn(outputs, targets) -> number; logged as val_<fn>."""

    def __post_init__(self) -> None:
        for name in ("steps", "grad_accum", "log_every", "max_bad_steps"):
            if getattr(self, name) < 1:
                raise UserError(f"train.{name} = {getattr(self, name)}: must be >= 1")
        for name in ("warmup_steps", "eval_every"):
            if getattr(self, name) < 0:
                raise UserError(f"train.{name} = {getattr(self, name)}: must be >= 0")
        for name in ("lr", "weight_decay", "grad_clip"):  # nan passes every comparison: check it first
            v = getattr(self, name)
            if v != v or v in (float("inf"), float("-inf")):
                raise UserError(f"train.{name} = {v}: must be a finite number")
        if not self.lr > 0:
            raise UserError(f"train.lr = {self.lr}: must be > 0")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise UserError("train.weight_decay and train.grad_clip must be >= 0 (grad_clip 0 = off)")
        if self.optimizer not in ("adamw", "adam", "sgd") and ":" not in self.optimizer:
            raise UserError(f"train.optimizer = {self.optimizer!r}: expected \"adamw\", \"adam\", \"sgd\" or "
                            "'pkg.module:factory'")
        for key in ("callbacks", "eval_metrics"):
            bad = [x for x in getattr(self, key) if not isinstance(x, str) or ":" not in x]
            if bad:
                raise UserError(f"train.{key} = {bad!r}: expected a list of 'pkg.module:name' strings")
        if self.loss not in ("cross_entropy", "mse", "model") and ":" not in self.loss:
            raise UserError(f"train.loss = {self.loss!r}: "
                            "expected \"cross_entropy\", \"mse\", \"model\" or 'pkg.module:fn'")


def train_step(tr: Trainee, micro_batches: list, clip: float, want_norm: bool = True,
               fwd_timer: ForwardTimer | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over the micro-batches of an accumulation. Returns (mean loss, grad norm) as
    device tensors: nothing here waits for the GPU. The norm is computed when clipping or when asked."""
    accum = len(micro_batches)
    loss_sum = torch.zeros((), device=tr.device)
    _copies_current(tr)
    pp = tr.step_module if isinstance(tr.step_module, PipelineRunner) else None
    if pp:  # the schedule interleaves forwards and backwards of the stages; the loss comes from the last
        with phase("forward"), precision.autocast(tr.dtype, tr.device):
            loss_sum = pp.forward_backward(micro_batches)
        micro_batches = []
    for i, (x, y) in enumerate(micro_batches):
        with grad_sync(tr.model, last_micro_step=i == accum - 1):  # DDP/FSDP: reduce on the last micro-batch
            if fwd_timer:
                fwd_timer.start()
            with phase("forward"), precision.autocast(tr.dtype, tr.device):
                loss = tr.step_module(x, y) / accum  # mean over micro-batches = mean over the global batch
            if fwd_timer:
                fwd_timer.stop()
            with phase("backward"):
                tr.scaler.scale(loss).backward()
        loss_sum += loss.detach()
    with phase("optimizer"):
        tr.scaler.unscale_(tr.opt)  # no-op unless fp16: grads back to true scale before clipping
        grad_norm = None
        if clip > 0 or want_norm:  # fused optimizers take the clip in their kernel (not with fp16's scaler)
            fold = None if tr.scaler.is_enabled() else tr.opt
            grad_norm = (pp.clip_grad_norm if pp else partial(clip_grad_norm, tr.model.parameters(), opt=fold))(
                clip if clip > 0 else math.inf)
        tr.scaler.step(tr.opt)  # fp16: skipped when grads hold inf/NaN
        tr.opt.__dict__.pop("grad_scale", None)  # a folded clip is this step's only
        tr.scaler.update()
        tr.opt.zero_grad(set_to_none=True)
        _schedule_step(tr)
    return loss_sum, grad_norm


def _copies_current(tr: Trainee) -> None:
    """Before a forward: the linears' bf16 weight copies equal their float32 weights (accel/weight_copies.py)."""
    if getattr(tr.opt, "copies", None):
        drop_replaced(tr.model)
        tr.opt.sync_copies()


def _schedule_step(tr: Trainee) -> None:
    """The LR schedule's step. Under fp16 the scaler skips an optimizer step whose gradients overflowed (the
    first ones, while it finds its scale), and torch would warn on stderr of a misordered call: the schedule
    moves on, as the scaler means it to."""
    if not tr.scaler.is_enabled():
        tr.sched.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        tr.sched.step()


def first_train_step(tr: Trainee, micro_batches: list, clip: float):
    """Compilation happens inside the first step; a compiler error falls back to eager and redoes it. A batch
    shape FP8 cannot take fails here too, compiled or not, and ends as one UserError."""
    try:
        return train_step(tr, micro_batches, clip)
    except Exception as e:
        if (shape := fp8_shape_error(e)) is not None:  # the data's shape, not the compiler: eager fails alike
            raise shape from None
        if not is_compile_error(e):
            raise
        disable_compile(tr.compiled, e)
        tr.compiled = []
        tr.opt.zero_grad(set_to_none=True)
        return train_step(tr, micro_batches, clip)


class EvalFailed(UserError):
    """The user's val data, eval-mode model or eval metric failed in an evaluation: training itself is fine."""


class EvalOutOfMemory(EvalFailed, MemoryError):
    """Evaluation ran out of memory (device or host): one line with the fix, and still a MemoryError to a Python
    caller that catches those."""


_EVAL_MODE = "fix it there (training's checks ran it in train mode; evaluation runs model.eval() under no_grad)"


@contextmanager
def _users(what: str, fix: str):
    """Evaluation meets val items and an eval-mode path that the checks of the first batch did not: the user's
    dataset, model or metric failing there is one EvalFailed naming it, as a training batch's failure is a
    UserError (a compiler error is not theirs: it passes)."""
    try:
        yield
    except EvalFailed:
        raise
    except UserError as e:  # a check's verdict, already one line
        raise EvalFailed(str(e)) from e
    except Exception as e:
        if (oom := _out_of_memory(e)) is not None:  # training's steps fit: the trainer saves them first, as for
            # any failure of evaluation; the frames of the failed forward (its activations) are let go for that save
            raise EvalOutOfMemory(f"evaluation ran out of memory in {what} ({oom}); training's steps fit, "
                                  f"evaluation's did not: lower data.batch_size and raise train.grad_accum (the same "
                                  f"global batch), or turn evaluation off with data.eval_batches=0") \
                from e.with_traceback(None)
        if is_compile_error(e):
            raise
        text = " ".join(str(e).split())[:200] or "(no message)"
        raise EvalFailed(f"evaluation: {what} failed: {type(e).__name__}: {text}{where(e)}; {fix}") from e


LIBRARY_OOM = ("CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def _out_of_memory(e: BaseException) -> str | None:
    """What ran out for an out-of-memory error (the device's, or the host's: Python's MemoryError, torch's host
    allocator's RuntimeError), else None."""
    text = " ".join(str(e).split())
    if isinstance(e, torch.OutOfMemoryError):
        return text[:160] or "device memory"
    if isinstance(e, MemoryError):
        return f"host memory: {text[:120]}" if text else "host memory"
    if isinstance(e, RuntimeError) and "can't allocate memory" in text and "CPUAllocator" in text:
        size = re.search(r"allocate (\d+) bytes", text)
        return f"host memory: tried to allocate {int(size.group(1)) / 2**30:.1f} GiB" if size else "host memory"
    if isinstance(e, RuntimeError) and any(m in text for m in LIBRARY_OOM):
        return text[:160]  # a library's allocation failing on the device, not torch's caching allocator
    cause = e.__cause__
    return _out_of_memory(cause) if cause is not None and cause is not e else None  # wrapped (compile, a hook)


@torch.no_grad()
def evaluate(tr: Trainee, ds: Dataset | None, micro: int, n_global: int, accum: int, env: DistEnv,
             metrics: dict | None = None) -> dict:
    """Mean val loss (and accuracy for classifiers, and each user metric fn(outputs, targets) as val_<name>)
    over fixed validation micro-batches, eval mode, on all ranks. The set is `n_global` global batches
    whatever the micro-batch split: comparable across configs."""
    if ds is None or n_global == 0 or len(ds) < micro:
        return {}
    pp = tr.step_module if isinstance(tr.step_module, PipelineRunner) else None
    # pipeline: the stages of a data-parallel group see its batches
    dp_rank, dp_world = (pp.dp_rank, pp.dp_world) if pp else (env.rank, env.world_size)
    batches = eval_batches(ds, micro, n_global * accum * dp_world, dp_rank, dp_world)
    if not batches:  # fewer val micro-batches than ranks: no comparable val figure (same on every rank)
        return {}
    wl = tr.step_module.module if isinstance(tr.step_module, DDP) else tr.step_module  # eval needs no DDP
    net, loss_fn, metrics = getattr(wl, "model", None), getattr(wl, "loss_fn", None), metrics or {}
    with _users("model.eval()", "an override of train() must take nn.Module.train's `mode` (eval() calls "
                "train(False))"):
        tr.model.eval()
    if isinstance(tr.step_module, DDP):  # each rank's BatchNorm ran on its own shards: evaluate the statistics a
        rank0_running_stats(tr.model)  # checkpoint saves (FSDP2's forward hook takes them: fsdp._eval_from_rank0)
    _copies_current(tr)
    try:  # an error in eval (out of memory, the user's metric) leaves the model in train mode all the same
        sums = _eval_sums(tr, ds, batches, net, loss_fn, metrics, pp)
    finally:
        tr.model.train()
    # sync point, once per eval: sums over ranks
    total = [v * env.world_size for v in all_mean(sums.tolist(), tr.device)]
    n = len(batches) * dp_world
    val_loss = total[0] / n
    if not math.isfinite(val_loss):  # null in the JSON files, as the val metrics are; said, for it is no figure
        say(f"warning: the validation loss is {val_loss} (NaN/inf): logged as null; the model diverged in eval "
            "mode, or the val data holds NaN/inf")
    row = {"val_loss": val_loss if math.isfinite(val_loss) else None}
    if total[2]:
        row["val_acc"] = total[1] / total[2]
    row.update({f"val_{name}": v / n if math.isfinite(v) else None for name, v in zip(metrics, total[3:])})  # JSON
    return row


def _eval_sums(tr: Trainee, ds: Dataset, batches: list, net, loss_fn, metrics: dict, pp) -> torch.Tensor:
    """This rank's sums over its validation batches: loss, correct, counted, then each metric."""
    sums = torch.zeros(3 + len(metrics), dtype=torch.float64, device=tr.device)  # loss, correct, total, metrics
    for idx in batches:
        with _users("reading a validation batch", "every val item is an (inputs, targets) pair like the train items"):
            batch = ds.gather(idx) if isinstance(ds, TensorDataset) else default_collate([ds[int(i)] for i in idx])
            x, y = (t.to(tr.device, non_blocking=True) for t in batch)
        with _users("the model or the loss in eval mode", _EVAL_MODE), precision.autocast(tr.dtype, tr.device):
            if pp:  # only the last stage has outputs and loss; the sum over ranks below is its sums
                out, loss = pp.eval_step(x, y)
                if out is None:
                    continue
            else:
                out = own_loss(net(x, y)) if loss_fn is None else net(x)
                check_eval_value(out, "forward(inputs, targets)" if loss_fn is None else "the model", loss_fn is None)
                loss = out if loss_fn is None else loss_fn(out, y)
                check_eval_value(loss, "the loss", loss=True)
            sums[0] += loss.float()
        if _classifies(loss_fn, out, y):
            counted = y != -100  # the positions F.cross_entropy ignores (padding) are no prediction to count
            sums[1] += ((out.argmax(-1) == y) & counted).sum()
            sums[2] += counted.sum()
        for i, (name, fn) in enumerate(metrics.items()):
            with _users(f"train.eval_metrics: {factory_label(fn)}", "fix it there"):
                sums[3 + i] += metric_value(call_user(fn, f"train.eval_metrics: {factory_label(fn)}", out.float(), y),
                                            f"train.eval_metrics: {factory_label(fn)}", tr.device)
    return sums


def _classifies(loss_fn, out: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether val_acc (argmax of the outputs == the targets) is a figure of this model: integer targets and an
    output with one axis more, of classes. The rule: never under mse or a model's own loss (a (B, 1) regression
    output against integer targets would score the share of targets equal to 0); the built-in cross_entropy
    always; any other loss (the user's, torch's CrossEntropyLoss) when that axis holds 2+ columns, as a single
    column is a value, whose argmax is always 0."""
    if loss_fn is None or loss_fn is mse or out.dim() != y.dim() + 1:
        return False
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        return False
    return loss_fn is cross_entropy or out.shape[-1] >= 2

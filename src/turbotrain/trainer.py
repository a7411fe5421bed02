"""The spine: build (data → model → techniques → optimizer), then the train loop.

Usage (Python API, same as the CLI):
    from turbotrain import load_config, train
    summary = train(load_config("gpt-shakespeare", ["train.steps=30"]))
    summary = train(cfg, model=my_model, train_data=my_ds, val_data=my_val, loss_fn=my_loss)
"""
from __future__ import annotations

import json
import math
import random
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, default_collate

from turbotrain.accel import precision
from turbotrain.accel.activation_ckpt import apply_activation_checkpointing
from turbotrain.accel.compile import apply_compile, compile_stats, disable_compile, is_compile_error
from turbotrain.accel.memory_format import apply_channels_last, resolve_channels_last
from turbotrain.accel.optim import build_optimizer, build_scheduler
from turbotrain.config import Config, TrainConfig, to_toml
from turbotrain.data.datasets import TensorDataset
from turbotrain.data.loader import (Batches, StepSampler, build_dataset, eval_batches,
                                    resolve_loader_settings, use_device_resident)
from turbotrain.errors import UserError
from turbotrain.models import build_model
from turbotrain.monitor.flops import flops_per_sample, peak_flops
from turbotrain.monitor.log import say
from turbotrain.monitor.logger import MetricsLogger
from turbotrain.monitor.nvml import GpuStats
from turbotrain.plugins import load_object

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class NonFiniteLoss(UserError):
    """The loss stayed NaN/inf for train.max_bad_steps steps in a row."""


# ---------------------------------------------------------------- building blocks

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"run.device = {name!r}: CUDA is not available here; use run.device=\"cpu\" or \"auto\"")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"run.device = {name!r}: only {torch.cuda.device_count()} GPU(s) visible")
    return device


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Logits (..., C) against integer targets (...), flattened; autocast runs it in fp32."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    y = y.to(out.dtype)
    if out.shape != y.shape and out.numel() == y.numel():
        y = y.reshape(out.shape)
    return F.mse_loss(out.float(), y.float())


def resolve_loss(name: str) -> LossFn | None:
    """None means the model computes its own loss from (inputs, targets)."""
    if name == "model":
        return None
    return {"cross_entropy": cross_entropy, "mse": mse}.get(name) or load_object(name, "train.loss")


class WithLoss(nn.Module):
    """model + loss as one module, so `scope="model"` compiles the loss into the same graph as the head
    (no fp32 logits round trip through memory)."""

    def __init__(self, model: nn.Module, loss_fn: LossFn | None):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is None:
            return self.model(x, y)
        return self.loss_fn(self.model(x), y)


def data_meta(ds: Dataset) -> dict:
    """What a dataset tells the model factory (used only for args the config leaves out)."""
    keys = ("vocab_size", "block_size", "num_classes", "in_channels", "in_features")
    return {k: getattr(ds, k) for k in keys if getattr(ds, k, None) is not None}


def peak_mem_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB; the process's peak RSS
    return kib / 2**20 if sys.platform != "darwin" else kib / 2**30


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Setup:
    """Everything the loop needs, built once."""
    cfg: Config
    device: torch.device
    dtype: str
    run_dir: Path
    model: nn.Module
    step_module: WithLoss
    compiled: list[nn.Module]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    batches: Batches
    val_ds: Dataset | None
    flops_per_sample: float
    flops_source: str
    peak_flops: float | None
    tokens_per_sample: int | None
    info: dict = field(default_factory=dict)


def build(cfg: Config, model: nn.Module | None = None, train_data: Dataset | None = None,
          val_data: Dataset | None = None, loss_fn: LossFn | None = None) -> Setup:
    device = resolve_device(cfg.run.device)
    dtype = precision.resolve_dtype(cfg.precision.dtype, device)
    precision.apply_tf32(dtype)
    seed_all(cfg.run.seed)
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(to_toml(cfg))
        (run_dir / "metrics.jsonl").write_text("")
    except OSError as e:
        raise UserError(f"run.out_dir: cannot write {run_dir} ({e.strerror})") from None

    train_ds = train_data if train_data is not None else build_dataset(cfg.data, "train")
    val_ds = val_data if val_data is not None else (build_dataset(cfg.data, "val") if train_data is None else None)

    # Build order: model on the CPU (seeded) → device → memory format → activation checkpointing →
    # compile → optimizer. Checkpointing wraps block forwards before compile so compile traces the
    # recompute regions; the optimizer comes last so it holds the final parameters.
    model = model if model is not None else build_model(cfg.model, **data_meta(train_ds))
    channels_last = resolve_channels_last(cfg.memory.channels_last, model, device)
    model = model.to(device)
    if channels_last:
        model = apply_channels_last(model)
    step_module = WithLoss(model, loss_fn if loss_fn is not None else resolve_loss(cfg.train.loss))

    micro, accum = cfg.data.batch_size, cfg.train.grad_accum
    sampler = StepSampler(len(train_ds), micro, accum, seed=cfg.run.seed)
    resident = use_device_resident(cfg.data, train_ds)
    settings = None if resident else resolve_loader_settings(cfg.data, device)
    batches = Batches(train_ds, sampler, device, resident, settings, channels_last)
    sample = _first_batch(train_ds, micro, device)
    tokens = sample[0].shape[1] if sample[0].dim() == 2 and not sample[0].is_floating_point() else None
    with precision.autocast(dtype, device):  # counted before checkpointing: recompute is not model FLOPs
        fps, source = flops_per_sample(model, sample, step_module)

    n_ckpt = apply_activation_checkpointing(model, cfg.memory.activation_checkpointing)
    compiled = apply_compile(step_module, cfg.compile, blocks_of=model)
    t = cfg.train
    opt = build_optimizer(model, t.optimizer, t.lr, t.weight_decay, device, t.optimizer_impl)
    sched = build_scheduler(opt, t.warmup_steps, t.steps, t.schedule)
    scaler = precision.build_scaler(dtype, device)

    n_params = sum(p.numel() for p in model.parameters())
    info = dict(device=str(device), device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                dtype=dtype, params=n_params, global_batch=micro * accum, micro_batch=micro, grad_accum=accum,
                world_size=1, channels_last=channels_last, activation_checkpointing=cfg.memory.activation_checkpointing,
                checkpointed_blocks=n_ckpt, compile=cfg.compile.enabled and {"mode": cfg.compile.mode, "scope": cfg.compile.scope},
                data_path="device-resident" if resident else f"DataLoader {settings}", torch=torch.__version__)
    say(f"model: {n_params / 1e6:.2f}M params on {info['device_name']} | precision {dtype} | "
        f"global batch {micro * accum} = micro {micro} x accum {accum} x world 1 | data: {info['data_path']}")
    return Setup(cfg, device, dtype, run_dir, model, step_module, compiled, opt, sched, scaler, batches, val_ds,
                 fps, source, peak_flops(device, dtype), tokens, info)


def _first_batch(ds: Dataset, micro: int, device: torch.device):
    idx = list(range(min(2, len(ds))))
    batch = ds.__getitems__(idx) if isinstance(ds, TensorDataset) else default_collate([ds[i] for i in idx])
    return tuple(t.to(device) for t in batch)


# ---------------------------------------------------------------- the loop

def train_step(s: Setup, micro_batches: list, want_norm: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over `grad_accum` micro-batches. Returns (mean loss, grad norm) as device
    tensors: nothing here waits for the GPU. The norm is computed when clipping or when asked (log steps)."""
    accum, clip = len(micro_batches), s.cfg.train.grad_clip
    loss_sum = torch.zeros((), device=s.device)
    for x, y in micro_batches:
        with precision.autocast(s.dtype, s.device):
            loss = s.step_module(x, y) / accum  # mean over micro-batches = mean over the global batch
        s.scaler.scale(loss).backward()
        loss_sum += loss.detach()
    s.scaler.unscale_(s.opt)  # no-op unless fp16: grads back to true scale before clipping
    grad_norm = None
    if clip > 0 or want_norm:
        params = [p for p in s.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf, foreach=True)
    s.scaler.step(s.opt)  # fp16: skipped when grads hold inf/NaN
    s.scaler.update()
    s.opt.zero_grad(set_to_none=True)
    s.sched.step()
    return loss_sum, grad_norm


@torch.no_grad()
def evaluate(s: Setup) -> dict:
    """Mean val loss (and accuracy for classifiers) over fixed val micro-batches, eager, eval mode."""
    ds = s.val_ds
    if ds is None or s.cfg.data.eval_batches == 0 or len(ds) < s.cfg.data.batch_size:
        return {}
    s.model.eval()
    losses, correct, total = [], 0, 0
    loss_fn = s.step_module.loss_fn
    for idx in eval_batches(ds, s.cfg.data.batch_size, s.cfg.data.eval_batches, 0, 1):
        batch = ds.gather(idx) if isinstance(ds, TensorDataset) else default_collate([ds[int(i)] for i in idx])
        x, y = (t.to(s.device, non_blocking=True) for t in batch)
        with precision.autocast(s.dtype, s.device):
            if loss_fn is None:
                losses.append(s.model(x, y).float())
                continue
            out = s.model(x)
            losses.append(loss_fn(out, y).float())
        if out.dim() == y.dim() + 1 and not y.is_floating_point():
            correct += (out.argmax(-1) == y).sum()
            total += y.numel()
    s.model.train()
    row = {"val_loss": torch.stack(losses).mean().item()}  # sync: once per eval
    if total:
        row["val_acc"] = float(correct) / total
    return row


def train(cfg: Config, model: nn.Module | None = None, train_data: Dataset | None = None,
          val_data: Dataset | None = None, loss_fn: LossFn | None = None) -> dict:
    """Train per `cfg`; returns the summary (also written to summary.json)."""
    t_start = time.perf_counter()
    s = build(cfg, model, train_data, val_data, loss_fn)
    t: TrainConfig = cfg.train
    logger = MetricsLogger(s.run_dir, t.steps)
    gpu = GpuStats(s.device)
    n_warm = min(3, max(1, t.steps // 10))  # first steps hold compile / CUDA-graph capture / allocator warm-up
    if s.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(s.device)
    s.model.train()
    t_loop = window_t0 = time.perf_counter()
    window_wait0, window_start = 0.0, 0
    timed_t0, excluded_s, windows, bad_streak, last = None, 0.0, [], 0, {}
    try:
        for step in range(t.steps):
            done = step + 1
            is_log = done % t.log_every == 0 or done == t.steps
            is_eval = (t.eval_every and done % t.eval_every == 0) or done == t.steps
            micro = [next(s.batches) for _ in range(t.grad_accum)]
            if step == 0 and s.compiled:
                loss, grad_norm = _first_step_with_fallback(s, micro)
            else:
                loss, grad_norm = train_step(s, micro, want_norm=is_log)
            if done == n_warm:  # end of warm-up: the timed region starts on a drained device
                sync(s.device)
                timed_t0 = time.perf_counter()
            if not (is_log or is_eval):
                continue
            sync(s.device)  # sync point: reading the clock and the loss
            t_log = time.perf_counter()
            dt, n = t_log - window_t0, done - window_start
            rate = n * s.info["global_batch"] / dt
            if window_start >= n_warm:
                windows.append(rate)
            row = {"step": done, "loss": loss.item(), "lr": s.sched.get_last_lr()[0], "grad_norm": grad_norm.item() if grad_norm is not None else None,
                   **_throughput(s, rate, dt / n, (s.batches.wait_s - window_wait0) / dt)}
            bad_streak = 0 if math.isfinite(row["loss"]) else bad_streak + min(n, t.log_every)
            if bad_streak >= t.max_bad_steps or (not math.isfinite(row["loss"]) and done == t.steps):
                raise NonFiniteLoss(f"loss is {row['loss']} at step {done} (non-finite for {bad_streak} steps); "
                                    f"lower train.lr, set train.grad_clip, or use precision.dtype=bf16")
            row["peak_mem_gib"] = round(peak_mem_gib(s.device), 4)
            row.update(gpu.read())
            if is_eval:
                row.update(evaluate(s))
            logger.log(row)
            last = row
            # restart the window after logging/eval, and keep their time out of the summary's throughput
            window_t0, window_wait0, window_start = time.perf_counter(), s.batches.wait_s, done
            if timed_t0 is not None:
                excluded_s += window_t0 - t_log
    finally:
        logger.close()
    timed = None
    if timed_t0 is not None and t.steps > n_warm:
        timed = (t.steps - n_warm) * s.info["global_batch"] / (window_t0 - timed_t0 - excluded_s)
    warm_s = (timed_t0 or window_t0) - t_loop
    summary = _summary(s, last, timed, windows, warm_s, n_warm, time.perf_counter() - t_start)
    (s.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    say(f"done: {summary['steps']} steps in {summary['wall_s']:.1f}s, loss {summary['final_loss']:.4f}"
        + (f", val_loss {summary['val_loss']:.4f}" if summary.get("val_loss") is not None else "")
        + f" → {s.run_dir}")
    return summary


def _first_step_with_fallback(s: Setup, micro: list):
    """Compilation happens inside the first step; a compiler error falls back to eager and redoes it."""
    try:
        return train_step(s, micro)
    except Exception as e:
        if not is_compile_error(e):
            raise
        disable_compile(s.compiled, e)
        s.compiled = []
        s.opt.zero_grad(set_to_none=True)
        return train_step(s, micro)


def _throughput(s: Setup, samples_per_s: float, step_s: float, wait_frac: float) -> dict:
    row = {"samples_per_s": samples_per_s, "step_ms": step_s * 1e3, "data_wait_pct": 100 * wait_frac}
    if s.tokens_per_sample:
        row["tokens_per_s"] = samples_per_s * s.tokens_per_sample
    row["mfu"] = min(1.0, samples_per_s * s.flops_per_sample / s.peak_flops) if s.peak_flops else None
    return row


def _summary(s: Setup, last: dict, samples_per_s: float | None, windows: list, warm_s: float, n_warm: int,
             wall_s: float) -> dict:
    timed = _throughput(s, samples_per_s, s.info["global_batch"] / samples_per_s, 0.0) if samples_per_s else {}
    steady_step_s = s.info["global_batch"] / samples_per_s if samples_per_s else 0.0
    out = {
        "steps": last.get("step"), "final_loss": last.get("loss"), "val_loss": last.get("val_loss"),
        "val_acc": last.get("val_acc"),
        "samples_per_s": samples_per_s,
        "samples_per_s_median_window": statistics.median(windows) if windows else None,
        "tokens_per_s": timed.get("tokens_per_s"), "step_ms": timed.get("step_ms"), "mfu": timed.get("mfu"),
        "peak_mem_gib": last.get("peak_mem_gib"), "data_wait_pct": last.get("data_wait_pct"),
        # warm-up steps' time beyond what they would take at steady speed (≈ compile + first-call costs)
        "compile_s": max(0.0, warm_s - n_warm * steady_step_s) if s.cfg.compile.enabled else 0.0,
        "warmup_s": warm_s, "warmup_steps_excluded": n_warm, "wall_s": wall_s,
        "flops_per_sample": s.flops_per_sample, "flops_source": s.flops_source, "peak_flops": s.peak_flops,
        **s.info,
    }
    if s.cfg.compile.enabled:
        out["compile_fell_back"] = not s.compiled
        out.update(compile_stats())
    return out

"""The spine: build (data → model → techniques → parallelism → optimizer), then the train loop.

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
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, default_collate

from turbotrain.accel import precision
from turbotrain.accel.activation_ckpt import apply_activation_checkpointing
from turbotrain.accel.attention import attention_backend
from turbotrain.accel.compile import (CompileConfig, WithLoss, apply_compile, compile_stats, disable_compile,
                                     is_compile_error)
from turbotrain.accel.memory_format import apply_channels_last, resolve_channels_last
from turbotrain.accel.optim import build_optimizer, build_scheduler, clip_grad_norm
from turbotrain.checkpoint import Checkpointer, param_shapes
from turbotrain.config import Config, to_toml
from turbotrain.data.datasets import TensorDataset
from turbotrain.data.loader import (Batches, StepSampler, build_dataset, eval_batches,
                                    resolve_loader_settings, use_device_resident)
from turbotrain.distributed.ddp import DDP, apply_ddp, grad_sync
from turbotrain.distributed.env import DistEnv, all_mean, init_distributed, resolve_strategy, shutdown
from turbotrain.distributed.fsdp import apply_fsdp, shard_local_step, unit_groups
from turbotrain.errors import UserError
from turbotrain.models import build_model
from turbotrain.monitor.alerts import Alerts
from turbotrain.monitor.flops import flops_per_sample, peak_flops
from turbotrain.monitor.log import say
from turbotrain.monitor.logger import MetricsLogger
from turbotrain.monitor.nvml import GpuStats
from turbotrain.monitor.phases import phase
from turbotrain.monitor.stragglers import ForwardTimer, StragglerWatch
from turbotrain.monitor.throughput import Meter
from turbotrain.plugins import load_object

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
    env: DistEnv
    strategy: str
    device: torch.device
    dtype: str
    run_dir: Path
    model: nn.Module  # as trained: wrapped by DDP / sharded by FSDP where asked
    step_module: nn.Module  # what a step calls: WithLoss(model), or DDP(WithLoss(model))
    compiled: list[nn.Module]
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    batches: Batches
    val_ds: Dataset | None
    ckpt: Checkpointer
    start_step: int
    flops_per_sample: float
    flops_source: str
    peak_flops: float | None
    tokens_per_sample: int | None
    info: dict = field(default_factory=dict)

    @property
    def global_batch(self) -> int:
        return self.info["global_batch"]


def build(cfg: Config, model: nn.Module | None = None, train_data: Dataset | None = None,
          val_data: Dataset | None = None, loss_fn: LossFn | None = None, probe: bool = False) -> Setup:
    """probe=True (profile): a throwaway build that leaves the run's config, metrics and checkpoints alone."""
    env = DistEnv.from_environ()
    strategy = resolve_strategy(cfg.parallel.strategy, env.world_size)
    device = resolve_device(cfg.run.device)
    if strategy != "none":
        device = init_distributed(env, device)
    dtype = precision.resolve_dtype(cfg.precision.dtype, device)
    precision.apply_tf32(dtype)
    seed_all(cfg.run.seed)  # same seed on every rank: identical initial weights, one data permutation
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if env.is_main and not probe:
            (run_dir / "config.toml").write_text(to_toml(cfg))
    except OSError as e:
        raise UserError(f"run.out_dir: cannot write {run_dir} ({e.strerror})") from None

    train_ds = train_data if train_data is not None else build_dataset(cfg.data, "train")
    val_ds = val_data if val_data is not None else (build_dataset(cfg.data, "val") if train_data is None else None)
    model = model if model is not None else build_model(cfg.model, **data_meta(train_ds))
    channels_last = resolve_channels_last(cfg.memory.channels_last, model, device)
    model = model.to(device)
    if channels_last:
        model = apply_channels_last(model)
    loss_fn = loss_fn if loss_fn is not None else resolve_loss(cfg.train.loss)

    micro, accum, world = cfg.data.batch_size, cfg.train.grad_accum, env.world_size
    sampler = StepSampler(len(train_ds), micro, accum, env.rank, world, cfg.run.seed)  # refuses too-small data
    sample = _first_batch(train_ds, device)
    tokens = sample[0].shape[1] if sample[0].dim() == 2 and not sample[0].is_floating_point() else None
    with precision.autocast(dtype, device):  # counted before checkpointing: recompute is not model FLOPs
        fps, source = flops_per_sample(model, sample, WithLoss(model, loss_fn))
    shapes = param_shapes(model)

    n_ckpt = apply_activation_checkpointing(model, cfg.memory.activation_checkpointing)
    model, step_module, compiled, compile_cfg = parallelize(model, loss_fn, cfg, strategy, device, world, dtype)

    t = cfg.train
    opt = build_optimizer(model, t.optimizer, t.lr, t.weight_decay, device, t.optimizer_impl)
    if strategy == "fsdp":
        opt = shard_local_step(opt)
    sched = build_scheduler(opt, t.warmup_steps, t.steps, t.schedule)
    scaler = precision.build_scaler(dtype, device)

    ckpt = Checkpointer(cfg.checkpoint, run_dir, env.rank, world, sharded=strategy == "fsdp")
    start_step, resumed = 0, ckpt.find_resume()
    if resumed is None and env.is_main and not probe:
        ckpt.set_aside_old()  # a fresh run must not mix (or prune) an earlier run's checkpoints
    if cfg.checkpoint.every:
        try:
            ckpt.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"checkpoint: cannot create {ckpt.dir} ({e.strerror})") from None
    if resumed is not None:
        expect = {"param_shapes": shapes, "global_batch": micro * accum * world, "optimizer": t.optimizer, "dtype": dtype}
        start_step = ckpt.load(resumed, model, opt, sched, scaler, expect)
        say(f"resumed from step {start_step} ({resumed})")
    if env.is_main and not probe:
        _trim_metrics(run_dir / "metrics.jsonl", start_step)
    if start_step >= t.steps:
        raise UserError(f"the checkpoint is at step {start_step}, the run asks for train.steps={t.steps}: nothing to do; "
                        f"raise train.steps or set checkpoint.resume=\"never\"")

    sampler.start_step = start_step
    resident = use_device_resident(cfg.data, train_ds)
    settings = None if resident else resolve_loader_settings(cfg.data, device, env.local_world_size)
    batches = Batches(train_ds, sampler, device, resident, settings, channels_last)

    n_params = sum(p.numel() for p in model.parameters()) if strategy != "fsdp" else sum(map(math.prod, shapes.values()))
    info = dict(device=str(device), device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                dtype=dtype, params=n_params, global_batch=micro * accum * world, micro_batch=micro, grad_accum=accum,
                world_size=world, strategy=strategy, channels_last=channels_last,
                activation_checkpointing=cfg.memory.activation_checkpointing, checkpointed_blocks=n_ckpt,
                compile=compile_cfg.enabled and {"mode": compile_cfg.mode, "scope": compile_cfg.scope},
                data_path="device-resident" if resident else f"DataLoader {settings}", torch=torch.__version__,
                resumed_from=start_step)
    say(f"model: {n_params / 1e6:.2f}M params on {info['device_name']} | precision {dtype} | parallel {strategy} | "
        f"global batch {micro * accum * world} = micro {micro} x accum {accum} x world {world} | data: {info['data_path']}")
    return Setup(cfg, env, strategy, device, dtype, run_dir, model, step_module, compiled, opt, sched,
                 scaler, batches, val_ds, ckpt, start_step, fps, source, peak_flops(device, dtype), tokens, info)


def parallelize(model: nn.Module, loss_fn: LossFn | None, cfg: Config, strategy: str, device: torch.device,
                world: int, dtype: str) -> tuple[nn.Module, nn.Module, list[nn.Module], CompileConfig]:
    """Compile and data parallelism, in this order (torchtitan's), after activation checkpointing has
    wrapped the block forwards (so compile traces the recompute regions):
    1. per-block compile, before sharding/wrapping, so each block is one graph;
    2. DDP or FSDP2;
    3. whole-model compile last, over the DDP-wrapped model: dynamo splits the graph at bucket
       boundaries, so each bucket's all-reduce overlaps the rest of backward."""
    c = cfg.compile
    # units of several blocks keep the whole-model compile, the loss fused with the head (per-block compile ran
    # 1.12x faster on GPT-2 124M with 3 units, at 1.5x the memory with the logits unfused: compile.scope="blocks")
    groups = unit_groups(model, cfg.parallel.fsdp_units) if strategy == "fsdp" else []
    if c.enabled and c.scope == "model" and groups and max(map(len, groups)) == 1:
        say("compile: FSDP2 per-block units compile per block (scope=blocks); a whole-model graph would break at every unit")
        c = replace(c, scope="blocks")
    if strategy != "none" and c.enabled and c.mode == "reduce-overhead":
        say("compile: CUDA graphs (reduce-overhead) cannot hold DDP/FSDP collectives; using mode=default")
        c = replace(c, mode="default")
    if strategy == "none" and cfg.parallel.grad_compression != "none":
        say("parallel.grad_compression: one process has no gradients to reduce; ignored")
    compiled = apply_compile(model, c) if c.scope == "blocks" else []
    if strategy == "ddp":  # DDP wraps model + loss: dynamo breaks the graph at DDP's own forward, so the
        model = step_module = apply_ddp(WithLoss(model, loss_fn), device, cfg.parallel)  # loss stays with the head
    else:
        if strategy == "fsdp":
            model = apply_fsdp(model, device, world, dtype, cfg.parallel)
        step_module = WithLoss(model, loss_fn)
    if c.scope == "model":
        compiled = apply_compile(step_module, c)
    return model, step_module, compiled, c


def _first_batch(ds: Dataset, device: torch.device):
    idx = list(range(min(2, len(ds))))
    batch = ds.__getitems__(idx) if isinstance(ds, TensorDataset) else default_collate([ds[i] for i in idx])
    return tuple(t.to(device) for t in batch)


def _trim_metrics(path: Path, step: int) -> None:
    """On resume keep the rows up to the checkpoint's step: the steps after it are redone."""
    kept = []
    for line in (path.read_text().splitlines() if path.exists() and step else []):
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by a crash mid-write
            continue
        if row.get("step", 0) <= step:
            kept.append(line)
    path.write_text("".join(r + "\n" for r in kept))


# ---------------------------------------------------------------- the loop

def train_step(s: Setup, micro_batches: list, want_norm: bool = True,
               fwd_timer: ForwardTimer | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over `grad_accum` micro-batches. Returns (mean loss, grad norm) as device
    tensors: nothing here waits for the GPU. The norm is computed when clipping or when asked (log steps)."""
    accum, clip = len(micro_batches), s.cfg.train.grad_clip
    loss_sum = torch.zeros((), device=s.device)
    for i, (x, y) in enumerate(micro_batches):
        with grad_sync(s.model, last_micro_step=i == accum - 1):  # DDP/FSDP: reduce on the last micro-batch
            if fwd_timer:
                fwd_timer.start()
            with phase("forward"), precision.autocast(s.dtype, s.device):
                loss = s.step_module(x, y) / accum  # mean over micro-batches = mean over the global batch
            if fwd_timer:
                fwd_timer.stop()
            with phase("backward"):
                s.scaler.scale(loss).backward()
        loss_sum += loss.detach()
    with phase("optimizer"):
        s.scaler.unscale_(s.opt)  # no-op unless fp16: grads back to true scale before clipping
        grad_norm = None
        if clip > 0 or want_norm:
            grad_norm = clip_grad_norm(s.model.parameters(), clip if clip > 0 else math.inf)
        s.scaler.step(s.opt)  # fp16: skipped when grads hold inf/NaN
        s.scaler.update()
        s.opt.zero_grad(set_to_none=True)
        s.sched.step()
    return loss_sum, grad_norm


@torch.no_grad()
def evaluate(s: Setup) -> dict:
    """Mean val loss (and accuracy for classifiers) over fixed val micro-batches, eval mode, all ranks."""
    ds = s.val_ds
    if ds is None or s.cfg.data.eval_batches == 0 or len(ds) < s.cfg.data.batch_size:
        return {}
    # the val set is eval_batches global batches, whatever the micro-batch split: comparable across configs
    n_micro = s.cfg.data.eval_batches * s.cfg.train.grad_accum * s.env.world_size
    batches = eval_batches(ds, s.cfg.data.batch_size, n_micro, s.env.rank, s.env.world_size)
    if not batches:  # fewer val micro-batches than ranks: no comparable val figure (same on every rank)
        return {}
    s.model.eval()
    loss_sum, correct, total, n = torch.zeros((), device=s.device), 0, 0, 0
    wl = s.step_module.module if isinstance(s.step_module, DDP) else s.step_module  # eval needs no DDP
    net, loss_fn = wl.model, wl.loss_fn
    for idx in batches:
        batch = ds.gather(idx) if isinstance(ds, TensorDataset) else default_collate([ds[int(i)] for i in idx])
        x, y = (t.to(s.device, non_blocking=True) for t in batch)
        with precision.autocast(s.dtype, s.device):
            out = net(x, y) if loss_fn is None else net(x)
            loss_sum += (out if loss_fn is None else loss_fn(out, y)).float()
        n += 1
        if loss_fn is not None and out.dim() == y.dim() + 1 and not y.is_floating_point():
            correct += (out.argmax(-1) == y).sum()
            total += y.numel()
    s.model.train()
    # sync point, once per eval: sums over ranks
    val_loss, correct, total, n = all_sum([float(loss_sum), float(correct), float(total), float(n)], s)
    row = {"val_loss": val_loss / max(n, 1)}
    if total:
        row["val_acc"] = correct / total
    return row


def all_sum(values: list[float], s: Setup) -> list[float]:
    return [v * s.env.world_size for v in all_mean(values, s.device)]


class StopRequest:
    """SIGTERM/SIGINT set a flag; the loop finishes the step, saves a checkpoint and exits."""

    def __init__(self):
        self.signum = 0
        self._old = {}
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._old = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


class Stopped(Exception):
    def __init__(self, signum: int, step: int):
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}")
        self.signum, self.step = signum, step


def train(cfg: Config, model: nn.Module | None = None, train_data: Dataset | None = None,
          val_data: Dataset | None = None, loss_fn: LossFn | None = None) -> dict:
    """Train per `cfg`; returns the summary (also written to summary.json by rank 0)."""
    t_start = time.perf_counter()
    try:
        with attention_backend(cfg.kernels.attention, resolve_device(cfg.run.device)):
            s = build(cfg, model, train_data, val_data, loss_fn)
            return _loop(s, t_start)
    finally:
        shutdown()


def _loop(s: Setup, t_start: float) -> dict:
    t, every = s.cfg.train, s.cfg.checkpoint.every
    main, multi = s.env.is_main, s.env.world_size > 1
    logger = MetricsLogger(s.run_dir, t.steps, enabled=main)
    gpu, alerts, stop = GpuStats(s.device), Alerts(t.max_bad_steps), StopRequest()
    fwd_timer = ForwardTimer(s.device, enabled=multi)
    stragglers = StragglerWatch(s.cfg.parallel.straggler_ratio, s.device, s.env.rank)
    n_warm = min(3, max(1, (t.steps - s.start_step) // 10))  # compile / CUDA-graph capture / allocator warm-up
    if s.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(s.device)
    s.model.train()
    meter, last, done = Meter(n_warm, s.start_step), {}, s.start_step
    bad_streak = torch.zeros((), dtype=torch.int32, device=s.device)  # non-finite losses in a row
    try:
        for step in range(s.start_step, t.steps):
            done = step + 1
            is_log = done % t.log_every == 0 or done == t.steps
            is_eval = (t.eval_every and done % t.eval_every == 0) or done == t.steps
            micro = [next(s.batches) for _ in range(t.grad_accum)]
            if step == s.start_step and s.compiled:
                loss, grad_norm = first_train_step(s, micro)
            else:
                loss, grad_norm = train_step(s, micro, want_norm=is_log, fwd_timer=fwd_timer)
            bad_streak = torch.where(torch.isfinite(loss), 0, bad_streak + 1)  # on the device: no sync
            if done - s.start_step == n_warm:  # end of warm-up: the timed region starts on a drained device
                sync(s.device)
                meter.warm_done()
            if is_log or is_eval:
                last = _log_step(s, done, loss, grad_norm, bad_streak, is_eval, meter, logger, gpu, alerts, fwd_timer,
                                 stragglers) or last
            if _agreed_stop(stop, s, is_log or not multi):
                if every:
                    s.ckpt.save(done, s.model, s.opt, s.sched, s.scaler, _ckpt_meta(s))
                raise Stopped(stop.signum, done)
            if every and done % every == 0 and done < t.steps and _finite(s, loss, grad_norm):  # sync point
                s.ckpt.save(done, s.model, s.opt, s.sched, s.scaler, _ckpt_meta(s))
    except Stopped as e:
        say(f"{e}; " + ("checkpoint saved — rerun the same command to resume" if every else
                       "checkpointing is off (checkpoint.every=0): progress is lost"))
        raise SystemExit(128 + e.signum)
    finally:
        stop.restore()
        logger.close()
    if every:
        s.ckpt.save(done, s.model, s.opt, s.sched, s.scaler, _ckpt_meta(s))
    samples_per_s = meter.timed_rate(done, s.global_batch)
    summary = _summary(s, last, samples_per_s, meter, time.perf_counter() - t_start)
    if main:
        (s.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    say(f"done: {summary['steps']} steps in {summary['wall_s']:.1f}s, loss {summary['final_loss']:.4f}"
        + (f", val_loss {summary['val_loss']:.4f}" if summary.get("val_loss") is not None else "")
        + f" → {s.run_dir}")
    return summary


def _finite(s: Setup, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> bool:
    """A checkpoint of NaN weights would poison every resume: skip the save on a non-finite step
    (decided together, so every rank saves or none does)."""
    bad = not math.isfinite(loss.item()) or (grad_norm is not None and not math.isfinite(grad_norm.item()))
    ok = all_mean([float(bad)], s.device)[0] == 0
    if not ok:
        say("warning: non-finite loss or gradients at a checkpoint step; checkpoint skipped")
    return ok


def _agreed_stop(stop: StopRequest, s: Setup, check: bool) -> bool:
    """Single process: stop after the current step. Several ranks agree at log steps (a collective per
    step would cost a sync each step), so all of them save the same step."""
    if s.env.world_size == 1:
        return stop.signum != 0
    if not check:
        return False
    flag = all_mean([float(stop.signum)], s.device)[0]
    if flag and not stop.signum:
        stop.signum = signal.SIGTERM
    return flag != 0


def _log_step(s: Setup, done: int, loss, grad_norm, bad_streak: torch.Tensor, is_eval: bool, meter: Meter,
              logger: MetricsLogger, gpu: GpuStats, alerts: Alerts, fwd_timer: ForwardTimer,
              stragglers: StragglerWatch) -> dict:
    sync(s.device)  # sync point: reading the clock and the loss
    dt, n, wait = meter.window(done, s.batches.wait_s)
    rate = n * s.global_batch / dt
    meter.record(rate)
    loss_v, peak, streak = all_mean([loss.item(), peak_mem_gib(s.device), bad_streak.item()], s.device)  # over ranks
    row = {"step": done, "loss": loss_v, "lr": s.sched.get_last_lr()[0],
           "grad_norm": grad_norm.item() if grad_norm is not None else None, **_throughput(s, rate, dt / n, wait / dt),
           "peak_mem_gib": round(peak, 4)}
    if s.env.world_size > 1:
        row.update(stragglers.update((fwd_timer.take() + wait) / n, done))
    alerts.check_loss(loss_v, done, streak, final=done == s.cfg.train.steps)
    alerts.check_rate(rate, done)
    row.update(gpu.read())
    if is_eval:
        row.update(evaluate(s))
    logger.log(row)
    meter.restart(done, s.batches.wait_s)
    return row


def _ckpt_meta(s: Setup) -> dict:
    return {"global_batch": s.global_batch, "strategy": s.strategy, "param_shapes": param_shapes(s.model),
            "optimizer": s.cfg.train.optimizer, "dtype": s.dtype, "config": to_toml(s.cfg)}


def first_train_step(s: Setup, micro: list):
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
    per_device = samples_per_s / s.env.world_size
    row["mfu"] = min(1.0, per_device * s.flops_per_sample / s.peak_flops) if s.peak_flops else None
    return row


def _summary(s: Setup, last: dict, samples_per_s: float | None, meter: Meter, wall_s: float) -> dict:
    timed = _throughput(s, samples_per_s, s.global_batch / samples_per_s, 0.0) if samples_per_s else {}
    steady_step_s = s.global_batch / samples_per_s if samples_per_s else 0.0
    out = {
        "steps": last.get("step"), "final_loss": last.get("loss"), "val_loss": last.get("val_loss"),
        "val_acc": last.get("val_acc"),
        "samples_per_s": samples_per_s, "samples_per_s_median_window": meter.median_window,
        "samples_per_s_per_device": samples_per_s / s.env.world_size if samples_per_s else None,
        "tokens_per_s": timed.get("tokens_per_s"), "step_ms": timed.get("step_ms"), "mfu": timed.get("mfu"),
        "peak_mem_gib": last.get("peak_mem_gib"), "data_wait_pct": last.get("data_wait_pct"),
        # warm-up steps' time beyond what they would take at steady speed (≈ compile + first-call costs)
        "compile_s": max(0.0, meter.warm_s - meter.n_warm * steady_step_s) if s.cfg.compile.enabled else 0.0,
        "warmup_s": meter.warm_s, "warmup_steps_excluded": meter.n_warm, "wall_s": wall_s,
        "flops_per_sample": s.flops_per_sample, "flops_source": s.flops_source, "peak_flops": s.peak_flops,
        **s.info,
    }
    if s.cfg.compile.enabled:
        out["compile_fell_back"] = not s.compiled
        out.update(compile_stats())
    return out

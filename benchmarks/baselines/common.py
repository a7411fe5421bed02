"""Shared pieces of the baseline scripts: the workloads, the optimizer recipe and an honest timer.

The baselines train the same models as turbotrain's presets (`gpt2-124m`, `resnet50-synthetic`), built
by turbotrain's own model builders so the shapes cannot drift, but everything else is plain PyTorch:
synthetic data already on the device, bf16 autocast, the loss inside the compiled module, the optimizer
recipe of the presets (AdamW betas 0.9/0.95 with decay on matrices only, or SGD with momentum 0.9; fused
kernels on CUDA), linear warm-up then cosine decay, gradient clipping at 1.0.

Timing: warm-up steps (compile, autotuning, CUDA-graph capture) run first and are reported apart; then
`windows` windows of `window_steps` steps, each closed by `torch.cuda.synchronize()` before the clock is
read; the figure is the median window, with the slowest and fastest beside it. One JSON line per run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

GPT2 = {"vocab": 50304, "seq": 1024, "layers": 12, "heads": 12, "embd": 768, "batch": 16}
RESNET50 = {"batch": 256, "image": 224, "classes": 1000}
LLAMA1B = {"vocab": 128256, "seq": 2048, "batch": 4}  # the llama-1b preset; the model's defaults are its shapes
POOL = 8  # distinct synthetic batches cycled through (a real loader would never repeat one)


def add_common_args(p: argparse.ArgumentParser, steps: int, batch: int) -> None:
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a wiring check, not a figure)")
    p.add_argument("--batch", type=int, default=batch, help="per-device batch")
    p.add_argument("--steps", type=int, default=steps, help="timed steps (split into --windows windows)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="untimed steps first, compile included (default: 8 on CUDA, 1 on the CPU)")
    p.add_argument("--windows", type=int, default=5, help="timed windows; the median is reported")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None,
                   help="autocast dtype (default: bf16 on CUDA; fp32 on the CPU, where bf16 matmuls crawl)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode: default | reduce-overhead | max-autotune-no-cudagraphs | none "
                        "(default: 'default' on CUDA, 'none' on the CPU, where compiling takes minutes)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping max norm (0: off)")
    p.add_argument("--no-fused", action="store_true", help="foreach optimizer kernels instead of fused")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the preset's)")
    p.add_argument("--schedule-warmup", type=int, default=10, help="LR warm-up steps before the cosine")
    p.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True, help="TF32 matmuls (on)")


def setup_device(args: argparse.Namespace) -> torch.device:
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = device.type == "cuda"
    cuda = device.type == "cuda"
    if args.warmup_steps is None:
        args.warmup_steps = 8 if cuda else 1
    if args.dtype is None:
        args.dtype = "bf16" if cuda else "fp32"
    if args.compile_mode is None:
        args.compile_mode = "default" if cuda else "none"
    if not cuda:
        print(f"baseline: CPU wiring check: {args.dtype}, compile {args.compile_mode}, "
              f"foreach optimizer, {args.warmup_steps} warm-up step(s) unless asked otherwise", file=sys.stderr)
    if not cuda and not args.no_fused:
        args.no_fused = True  # fused kernels are the CUDA recipe; said in the line above and in the JSON row
    return device


def maybe_compile(module: nn.Module, mode: str) -> nn.Module:
    return module if mode == "none" else torch.compile(module, mode=mode)


def autocast_dtype(name: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[name]


class WithCrossEntropy(nn.Module):
    """Model + loss as one module, so the compiled graph holds the loss too (no fp32 logits kept outside)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        return F.cross_entropy(out.flatten(0, -2), y.flatten())


@dataclass
class Workload:
    module: WithCrossEntropy           # model + loss
    batches: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    items_per_step: int                # tokens (GPT) or images (ResNet) per device per step
    unit: str                          # "tok/s" or "img/s"
    flops_per_item: float | None       # for MFU; None where not counted


def gpt_workload(args: argparse.Namespace, device: torch.device, seed: int = 0) -> Workload:
    from turbotrain.models.gpt import build  # the preset's model, so the shapes are the same

    torch.manual_seed(0)
    model = build(vocab_size=GPT2["vocab"], block_size=args.seq, n_layer=args.layers, n_head=GPT2["heads"],
                  n_embd=args.embd, dropout=0.0).to(device)
    return _token_workload(model, GPT2["vocab"], args, device, seed)


def llama_workload(args: argparse.Namespace, device: torch.device, seed: int = 0) -> Workload:
    from turbotrain.models.llama import build  # the llama-1b preset's model (Llama-3.2-1B shapes)

    torch.manual_seed(0)
    model = build(vocab_size=LLAMA1B["vocab"], block_size=args.seq).to(device)
    return _token_workload(model, LLAMA1B["vocab"], args, device, seed)


def _token_workload(model: nn.Module, vocab: int, args: argparse.Namespace, device: torch.device,
                    seed: int) -> Workload:
    """A language model on POOL synthetic token batches already on the device, inputs and next-token targets."""
    g = torch.Generator(device=device).manual_seed(seed)
    data = torch.randint(0, vocab, (POOL, args.batch, args.seq + 1), device=device, generator=g)
    step = iter(range(1 << 62))

    def batches() -> tuple[torch.Tensor, torch.Tensor]:
        d = data[next(step) % POOL]
        return d[:, :-1], d[:, 1:]

    return Workload(WithCrossEntropy(model), batches, args.batch * args.seq, "tok/s",
                    model.flops_per_token(args.seq))


def resnet_workload(args: argparse.Namespace, device: torch.device, seed: int = 0) -> Workload:
    from turbotrain.models.resnet import build

    torch.manual_seed(0)
    model = build(depth=50, num_classes=RESNET50["classes"]).to(device)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (POOL, args.batch, 3, args.image, args.image)
    images = torch.randn(shape, device=device, generator=g)
    labels = torch.randint(0, RESNET50["classes"], (POOL, args.batch), device=device, generator=g)
    step = iter(range(1 << 62))

    def batches() -> tuple[torch.Tensor, torch.Tensor]:
        i = next(step) % POOL
        return images[i].contiguous(memory_format=fmt), labels[i]

    return Workload(WithCrossEntropy(model), batches, args.batch, "img/s", None)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and kernels only; biases and norm gains are left alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, kind: str, lr: float, weight_decay: float, fused: bool) -> torch.optim.Optimizer:
    kernel = {"fused": True} if fused else {"foreach": True}
    if kind == "adamw":
        return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.95), **kernel)
    return torch.optim.SGD(param_groups(model, weight_decay), lr=lr, momentum=0.9, **kernel)


def check_optimizer_covers(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Refuse a run whose optimizer misses a trainable parameter of the model it steps: a framework that swaps
    parameters while wrapping (Accelerate's FP8 on one GPU) would leave those layers untrained and time less work."""
    held = {id(p) for group in opt.param_groups for p in group["params"]}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if missing:
        raise SystemExit(f"the optimizer does not hold {len(missing)} trainable parameters of the model "
                         f"(e.g. {', '.join(missing[:3])}): build it from the prepared model")


def warmup_cosine(opt: torch.optim.Optimizer, warmup: int, total: int, floor: float = 0.1):
    """Linear warm-up to the peak LR, then cosine decay to `floor` × peak at `total` steps."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], torch.Tensor], device: torch.device, warmup_steps: int, steps: int,
               windows: int, barrier: Callable[[], None] = lambda: None) -> dict:
    """Warm-up first (untimed), then `windows` timed windows; returns per-window step times in seconds."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(warmup_steps):
        loss = step()
    sync(device)
    barrier()
    warm_s = time.perf_counter() - t0
    windows = max(1, min(windows, steps))
    per_window = max(1, steps // windows)
    window_s = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(per_window):
            loss = step()
        sync(device)  # the clock is read only once the GPU has finished the window's work
        barrier()
        window_s.append((time.perf_counter() - t0) / per_window)
    return {"warmup_s": warm_s, "step_s": window_s, "loss": loss.item()}


def report(name: str, work: Workload, timing: dict, device: torch.device, args: argparse.Namespace,
           world: int = 1, **extra) -> dict:
    """One JSON line: median throughput per device, slowest/fastest window, peak memory, environment."""
    rates = sorted(work.items_per_step / s for s in timing["step_s"])
    median = statistics.median(rates)
    fig = lambda v: round(v) if v >= 100 else round(v, 2)  # noqa: E731 (CPU wiring checks run slow)
    row = {"name": name, "unit": work.unit, "per_device": fig(median), "total": fig(median * world),
           "window_min": fig(rates[0]), "window_max": fig(rates[-1]), "windows": len(rates),
           "ms_per_step": round(statistics.median(timing["step_s"]) * 1e3, 2), "warmup_s": round(timing["warmup_s"], 1),
           "loss": round(timing["loss"], 4), "world": world, "batch": args.batch, "dtype": args.dtype,
           "compile_mode": args.compile_mode, "clip": args.clip, "fused": not args.no_fused, **extra}
    if device.type == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        row["device"] = torch.cuda.get_device_name(device)
        if work.flops_per_item:
            row["mfu_989"] = round(median * work.flops_per_item / 989e12 * 100, 1)  # H100/H200 bf16 dense peak
    else:
        row["device"] = "cpu (wiring check, not a performance figure)"
    row.update(torch=torch.__version__, python=platform.python_version(), host=socket.gethostname())
    print(json.dumps(row), flush=True)
    return row


def here_on_path() -> None:
    """Let `python benchmarks/baselines/X.py` find turbotrain's sources without an install."""
    src = Path(__file__).resolve().parents[2] / "src"
    if src.is_dir() and str(src) not in sys.path:
        sys.path.append(str(src))

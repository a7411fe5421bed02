"""A comparator for `turbotrain bench --compare`: the same model, data, batch, steps, optimizer (type,
hyperparameters, fused kernel where there is one), LR schedule and clipping trained through HF Accelerate
or Lightning Fabric with their best documented settings for that math: bf16 by the framework, torch.compile
in the compile mode of turbotrain's config (Accelerate's `TorchDynamoPlugin`, Fabric's `torch.compile`
before `setup`; "reduce-overhead" gives them CUDA graphs too), channels_last and `cudnn.benchmark` where the
config's memory format is channels_last, TF32 for fp32 leftovers, the loss inside the module they compile
(a loss outside the graph keeps fp32 logits in memory and slows them down: benchmarks/NOTES.md, session 3).

It is a benchmark harness, not part of the library: `turbotrain bench --compare` runs it from a source
checkout in a fresh process: `python benchmarks/peers.py accelerate SUMMARY.json [CONFIG] [KEY=VALUE ...]`.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from turbotrain.accel.optim import build_optimizer, build_scheduler
from turbotrain.config import load_config
from turbotrain.data.loader import Batches, StepSampler, build_dataset
from turbotrain.errors import UserError
from turbotrain.losses import resolve_loss
from turbotrain.models import args_from_data, build_model
from turbotrain.models.structure import WithLoss
from turbotrain.resolve import facts_of, resolve
from turbotrain.workload import data_meta, peak_mem_gib, resolve_device, seed_all, sync


def _workload(cfg):
    """The trainer's model, data and data path (resolved the trainer's way), with their loader batches."""
    device = resolve_device(cfg.run.device)
    seed_all(cfg.run.seed)
    ds = build_dataset(cfg.data, "train")
    data_args = args_from_data(cfg.model, data_meta(ds))
    model = build_model(replace(cfg.model, args={**data_args, **cfg.model.args}))
    eff = resolve(cfg, facts_of(device, model, ds, data_args))
    data = eff.data
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    if eff.memory.channels_last:
        model = model.to(memory_format=torch.channels_last)
    micro = cfg.data.batch_size * cfg.train.grad_accum  # their loop: one batch per step, same global batch
    settings = None if data.device_resident else dict(
        num_workers=data.num_workers, pin_memory=data.pin_memory,
        prefetch_factor=data.prefetch_factor if data.num_workers else None,
        persistent_workers=data.persistent_workers and data.num_workers > 0)
    batches = Batches(ds, StepSampler(len(ds), micro, 1, seed=cfg.run.seed), device, data.device_resident, settings)
    mode = eff.compile.mode if eff.compile.enabled else "none"
    return model, ds, batches, device, micro, mode


def _through(tool: str, model, opt, device, mode: str):
    """The model + loss and optimizer prepared by the framework with its bf16 + compile settings."""
    bf16 = device.type == "cuda"
    if tool == "accelerate":
        from accelerate import Accelerator
        from accelerate.utils import TorchDynamoPlugin

        dynamo = TorchDynamoPlugin(backend="inductor", mode=mode) if mode != "none" else TorchDynamoPlugin(backend="no")
        acc = Accelerator(mixed_precision="bf16" if bf16 else "no", dynamo_plugin=dynamo, cpu=device.type == "cpu")
        model, opt = acc.prepare(model, opt)
        return model, opt, acc.backward, acc.clip_grad_norm_
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cuda" if bf16 else "cpu", devices=1, precision="bf16-mixed" if bf16 else "32-true")
    model, opt = fabric.setup(torch.compile(model, mode=mode) if mode != "none" else model, opt)
    return model, opt, fabric.backward, lambda params, max_norm: fabric.clip_gradients(model, opt, max_norm=max_norm)


def main(argv: list[str]) -> int:
    tool, summary_path, *rest = argv
    config = rest[0] if rest and "=" not in rest[0] else None
    cfg = load_config(config, rest[1:] if config else rest)
    t = cfg.train
    n_warm = min(3, max(1, t.steps // 10))
    if t.steps <= n_warm:
        raise UserError(f"train.steps = {t.steps}: a comparator needs more steps than its {n_warm} warm-up step(s)")
    model, ds, batches, device, micro, mode = _workload(cfg)
    opt = build_optimizer(model, t.optimizer, t.lr, t.weight_decay, device, impl="auto")
    model, opt, backward, clip = _through(tool, WithLoss(model, resolve_loss(t.loss)), opt, device, mode)
    sched = build_scheduler(opt, t.warmup_steps, t.steps, t.schedule)

    def step() -> torch.Tensor:
        x, y = next(batches)
        loss = model(x, y)
        backward(loss)
        if t.grad_clip > 0:
            clip(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(n_warm):
        step()
    sync(device)
    warm_s, t1 = time.perf_counter() - t0, time.perf_counter()
    for _ in range(t.steps - n_warm):
        loss = step()
    sync(device)
    rate = (t.steps - n_warm) * micro / (time.perf_counter() - t1)
    x, _ = ds[0]
    tokens = x.shape[0] if x.dim() == 1 and not x.is_floating_point() else None
    on_gpu = device.type == "cuda"
    summary = {"samples_per_s": rate, "samples_per_s_median_window": None,
               "tokens_per_s": rate * tokens if tokens else None,
               "peak_mem_gib": peak_mem_gib(device), "final_loss": loss.item(), "val_loss": None, "val_acc": None,
               "compile_s": warm_s, "global_batch": micro, "mfu": None, "dtype": "bf16" if on_gpu else "fp32",
               "device_name": torch.cuda.get_device_name(device) if on_gpu else "cpu", "framework": tool,
               "compile_mode": mode}
    Path(summary_path).parent.mkdir(parents=True, exist_ok=True)
    Path(summary_path).write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

"""A comparator for `turbotrain bench --compare`: the same model, data, batch, steps, optimizer (type,
hyperparameters, fused kernel where there is one), LR schedule and clipping trained through HF Accelerate
or Lightning Fabric with their own best settings (bf16 + compile), timed like ours. The loss is computed
inside the module they compile, as their docs' examples and our anchors do (a loss outside the graph keeps
fp32 logits in memory: on GPT-2 124M, one H200, 16 GiB instead of 8.5 and 0.80-0.84x the speed;
benchmarks/NOTES.md, session 3, runs 8 and 11).

Run by bench in a fresh process: `python -m turbotrain.compare accelerate SUMMARY.json [CONFIG] [KEY=VALUE ...]`.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from turbotrain.accel.compile import WithLoss
from turbotrain.accel.optim import build_optimizer, build_scheduler
from turbotrain.config import load_config
from turbotrain.data.loader import Batches, StepSampler, build_dataset, resolve_loader_settings, use_device_resident
from turbotrain.errors import UserError
from turbotrain.models import build_model
from turbotrain.trainer import data_meta, peak_mem_gib, resolve_device, resolve_loss, seed_all, sync


def main(argv: list[str]) -> int:
    tool, summary_path, *rest = argv
    config = rest[0] if rest and "=" not in rest[0] else None
    cfg = load_config(config, rest[1:] if config else rest)
    device = resolve_device(cfg.run.device)
    seed_all(cfg.run.seed)
    ds = build_dataset(cfg.data, "train")
    model = build_model(cfg.model, **data_meta(ds))
    loss_fn = resolve_loss(cfg.train.loss)
    t = cfg.train
    n_warm, steps = min(3, max(1, t.steps // 10)), t.steps
    if steps <= n_warm:
        raise UserError(f"train.steps = {steps}: a comparator needs more steps than its {n_warm} warm-up step(s)")
    micro = cfg.data.batch_size * t.grad_accum  # their loop: one batch per step, same global batch
    resident = use_device_resident(cfg.data, ds)
    settings = None if resident else resolve_loader_settings(cfg.data, device)
    batches = Batches(ds, StepSampler(len(ds), micro, 1, seed=cfg.run.seed), device, resident, settings)
    bf16 = device.type == "cuda"
    opt = build_optimizer(model, t.optimizer, t.lr, t.weight_decay, device, impl="auto")
    model = WithLoss(model, loss_fn)  # model + loss: one module to prepare and compile
    if tool == "accelerate":
        from accelerate import Accelerator

        acc = Accelerator(mixed_precision="bf16" if bf16 else "no", dynamo_backend="inductor", cpu=device.type == "cpu")
        model, opt = acc.prepare(model, opt)
        backward, clip = acc.backward, acc.clip_grad_norm_
    else:
        from lightning.fabric import Fabric

        fabric = Fabric(accelerator="cuda" if bf16 else "cpu", devices=1, precision="bf16-mixed" if bf16 else "32-true")
        model = torch.compile(model)
        model, opt = fabric.setup(model, opt)
        backward = fabric.backward
        clip = lambda params, max_norm: fabric.clip_gradients(model, opt, max_norm=max_norm)  # noqa: E731
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
    for _ in range(steps - n_warm):
        loss = step()
    sync(device)
    rate = (steps - n_warm) * micro / (time.perf_counter() - t1)
    x, _ = ds[0]
    tokens = x.shape[0] if x.dim() == 1 and not x.is_floating_point() else None
    summary = {"samples_per_s": rate, "samples_per_s_median_window": None, "tokens_per_s": rate * tokens if tokens else None,
               "peak_mem_gib": peak_mem_gib(device), "final_loss": loss.item(), "val_loss": None, "val_acc": None,
               "compile_s": warm_s, "global_batch": micro, "mfu": None, "dtype": "bf16" if bf16 else "fp32",
               "device_name": torch.cuda.get_device_name(device) if bf16 else "cpu", "framework": tool}
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

"""A comparator for `turbotrain bench --compare`: the same model, data, batch and steps trained through
HF Accelerate or Lightning Fabric with their own best settings (bf16 + compile), timed like ours.

Run by bench in a fresh process: `python -m turbotrain.compare accelerate SUMMARY.json [CONFIG] [KEY=VALUE ...]`.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from turbotrain.config import load_config
from turbotrain.data.loader import Batches, StepSampler, build_dataset, use_device_resident
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
    micro = cfg.data.batch_size * cfg.train.grad_accum  # their loop: one batch per step, same global batch
    batches = Batches(ds, StepSampler(len(ds), micro, 1, seed=cfg.run.seed), device, use_device_resident(cfg.data, ds))
    bf16 = device.type == "cuda"
    if tool == "accelerate":
        from accelerate import Accelerator

        acc = Accelerator(mixed_precision="bf16" if bf16 else "no", dynamo_backend="inductor", cpu=device.type == "cpu")
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        model, opt = acc.prepare(model, opt)
        backward = acc.backward
    else:
        from lightning.fabric import Fabric

        fabric = Fabric(accelerator="cuda" if bf16 else "cpu", devices=1, precision="bf16-mixed" if bf16 else "32-true")
        model = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        model, opt = fabric.setup(model, opt)
        backward = fabric.backward

    def step() -> torch.Tensor:
        x, y = next(batches)
        loss = model(x, y) if loss_fn is None else loss_fn(model(x), y)
        backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    n_warm, steps = min(3, max(1, cfg.train.steps // 10)), cfg.train.steps
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
    raise SystemExit(main(sys.argv[1:]))

"""Plain-PyTorch baseline: GPT-2 124M (the `gpt2-124m` preset's shapes) trained on one device.

bf16 autocast, torch.compile of model + loss (mode "default" unless --compile-mode says otherwise), fused
AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on matrices), 10 warm-up steps then cosine, clipping at
1.0 by torch's `clip_grad_norm_(foreach=True)`, synthetic tokens already on the GPU. Timing and output:
see common.py.

    PYTHONPATH=src python benchmarks/baselines/plain_gpt.py                       # one GPU, B=16, T=1024
    PYTHONPATH=src python benchmarks/baselines/plain_gpt.py --compile-mode reduce-overhead
    PYTHONPATH=src python benchmarks/baselines/plain_gpt.py --device cpu --steps 3 --batch 2 --seq 64 --layers 2
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import common
import torch


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(p, steps=100, batch=common.GPT2["batch"])
    p.add_argument("--seq", type=int, default=common.GPT2["seq"], help="tokens per sample")
    p.add_argument("--layers", type=int, default=common.GPT2["layers"], help="transformer blocks")
    p.add_argument("--embd", type=int, default=common.GPT2["embd"], help="model width")
    return p.parse_args(argv)


def make_step(work: common.Workload, args: argparse.Namespace, device: torch.device, module: torch.nn.Module,
              opt: torch.optim.Optimizer, sched) -> Callable[[], torch.Tensor]:
    """One training step: autocast forward (loss inside), backward, clip, optimizer, LR schedule."""
    dtype = common.autocast_dtype(args.dtype)
    params = list(work.module.parameters())

    def step() -> torch.Tensor:
        x, y = work.batches()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = module(x, y)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return loss
    return step


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    device = common.setup_device(args)
    work = common.gpt_workload(args, device)
    opt = common.build_optimizer(work.module, "adamw", args.lr or 6e-4, 0.1, fused=not args.no_fused)
    total = args.warmup_steps + args.steps
    sched = common.warmup_cosine(opt, args.schedule_warmup, total)
    module = common.maybe_compile(work.module, args.compile_mode)
    step = make_step(work, args, device, module, opt, sched)
    timing = common.time_steps(step, device, args.warmup_steps, args.steps, args.windows)
    return common.report("plain PyTorch GPT-2", work, timing, device, args, seq=args.seq, layers=args.layers)


if __name__ == "__main__":
    common.here_on_path()
    main()

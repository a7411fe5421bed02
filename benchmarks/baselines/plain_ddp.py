"""Plain-PyTorch DDP baseline: GPT-2 124M on N GPUs of one host, launched by torchrun (weak scaling:
B=16 per GPU). The same step as plain_gpt.py, with the model + loss wrapped in DistributedDataParallel
(buckets of --bucket-mb MB, gradients as bucket views) and then compiled; each rank draws its own tokens.
Rank 0 prints one JSON line with the tokens/s per GPU; run it at 1 GPU too for the efficiency.

    PYTHONPATH=src torchrun --standalone --nproc_per_node=2 benchmarks/baselines/plain_ddp.py
    PYTHONPATH=src torchrun --standalone --nproc_per_node=2 benchmarks/baselines/plain_ddp.py --clip 0 --bucket-mb 25
    PYTHONPATH=src torchrun --standalone --nproc_per_node=2 benchmarks/baselines/plain_ddp.py \
        --device cpu --steps 2 --batch 2 --seq 32 --layers 1 --embd 96        # gloo wiring check
"""
from __future__ import annotations

import argparse
import os

import common
import torch.distributed as dist
from plain_gpt import make_step
from plain_gpt import parse as parse_gpt
from torch.nn.parallel import DistributedDataParallel as DDP


def main(argv: list[str] | None = None) -> dict | None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--bucket-mb", type=int, default=100, help="DDP bucket_cap_mb (turbotrain's default 100)")
    known, rest = extra.parse_known_args(argv)
    args = parse_gpt(rest)
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    device = common.setup_device(args)
    work = common.gpt_workload(args, device, seed=rank)  # same weights on every rank, each its own data
    ddp = DDP(work.module, device_ids=[device.index] if cuda else None, bucket_cap_mb=known.bucket_mb,
              gradient_as_bucket_view=True)
    opt = common.build_optimizer(ddp, "adamw", args.lr or 6e-4, 0.1, fused=not args.no_fused)
    sched = common.warmup_cosine(opt, args.schedule_warmup, args.warmup_steps + args.steps)
    module = common.maybe_compile(ddp, args.compile_mode)
    step = make_step(work, args, device, module, opt, sched)
    timing = common.time_steps(step, device, args.warmup_steps, args.steps, args.windows, barrier=dist.barrier)
    row = None
    if rank == 0:
        row = common.report("plain PyTorch DDP GPT-2", work, timing, device, args, world=world,
                            bucket_mb=known.bucket_mb, seq=args.seq, layers=args.layers)
    dist.destroy_process_group()
    return row


if __name__ == "__main__":
    common.here_on_path()
    main()

"""Plain-PyTorch baseline: ResNet-50 (the `resnet50-synthetic` preset's model) at 224², B=256, one device.

bf16 autocast, channels_last, torch.compile of model + loss, fused SGD (lr 0.1, momentum 0.9, weight decay
5e-5 on kernels), 5 warm-up steps then cosine, clipping off (the preset does not clip; --clip 1.0 turns it
on), synthetic images already on the GPU. Timing and output: see common.py.

    PYTHONPATH=src python benchmarks/baselines/plain_resnet.py
    PYTHONPATH=src python benchmarks/baselines/plain_resnet.py --dtype fp16 --compile-mode none
    PYTHONPATH=src python benchmarks/baselines/plain_resnet.py --device cpu --steps 2 --batch 2 --image 64
"""
from __future__ import annotations

import argparse

import common
from plain_gpt import make_step


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(p, steps=50, batch=common.RESNET50["batch"])
    p.set_defaults(clip=0.0, schedule_warmup=5)
    p.add_argument("--image", type=int, default=common.RESNET50["image"], help="image side in pixels")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True, help="NHWC (on)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    device = common.setup_device(args)
    work = common.resnet_workload(args, device)
    opt = common.build_optimizer(work.module, "sgd", args.lr or 0.1, 5e-5, fused=not args.no_fused)
    sched = common.warmup_cosine(opt, args.schedule_warmup, args.warmup_steps + args.steps)
    module = common.maybe_compile(work.module, args.compile_mode)
    step = make_step(work, args, device, module, opt, sched)
    timing = common.time_steps(step, device, args.warmup_steps, args.steps, args.windows)
    return common.report("plain PyTorch ResNet-50", work, timing, device, args,
                         image=args.image, channels_last=args.channels_last)


if __name__ == "__main__":
    common.here_on_path()
    main()

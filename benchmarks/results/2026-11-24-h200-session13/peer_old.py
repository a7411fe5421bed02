"""Peer baselines: the same workload and recipe as plain_gpt.py / plain_resnet.py, trained through HF
Accelerate or Lightning Fabric on one GPU.

What each peer gets — their best documented settings for the same math: bf16 mixed precision by the
framework (Accelerate `mixed_precision="bf16"`, Fabric `precision="bf16-mixed"`), torch.compile in the mode
given by --compile-mode (Accelerate through its `TorchDynamoPlugin(backend="inductor", mode=...)`, Fabric by
`torch.compile(mode=...)` before `setup`; "reduce-overhead" gives both CUDA graphs), the same fused
optimizer, schedule and clipping (by the framework's own clip call), the loss inside the compiled module,
and for the convnet channels_last and `cudnn.benchmark` (common.py), TF32 for the fp32 leftovers.

    PYTHONPATH=src python benchmarks/baselines/peer.py --framework accelerate --workload gpt
    PYTHONPATH=src python benchmarks/baselines/peer.py --framework fabric --workload resnet
    PYTHONPATH=src python benchmarks/baselines/peer.py --framework accelerate --workload llama --fp8

--fp8 (Accelerate, llama): Accelerate's own FP8 backend on torchao (`mixed_precision="fp8"` with
`AORecipeKwargs()`, its documented defaults), on top of the same compile.
"""
from __future__ import annotations

import argparse
import sys

import common
import plain_gpt
import plain_resnet
import torch


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--framework", choices=("accelerate", "fabric"), required=True)
    pick.add_argument("--workload", choices=("gpt", "resnet", "llama"), default="gpt")
    pick.add_argument("--fp8", action="store_true", help="Accelerate's FP8 (torchao) backend instead of bf16")
    known, rest = pick.parse_known_args(argv)
    gpt = known.workload != "resnet"
    args = (plain_gpt.parse if gpt else plain_resnet.parse)(rest)
    if known.workload == "llama":
        args.seq = common.LLAMA1B["seq"] if args.seq == common.GPT2["seq"] else args.seq
        args.batch = common.LLAMA1B["batch"] if args.batch == common.GPT2["batch"] else args.batch
    if known.fp8 and known.framework != "accelerate":
        raise SystemExit("peer.py: --fp8 is Accelerate's FP8 backend (--framework accelerate)")
    device = common.setup_device(args)
    cuda = device.type == "cuda"
    if cuda and args.dtype != "bf16":
        raise SystemExit("peer.py: on a GPU the peers run bf16 mixed precision only (--dtype bf16)")
    work = {"gpt": common.gpt_workload, "resnet": common.resnet_workload,
            "llama": common.llama_workload}[known.workload](args, device)
    kind, lr, wd = ("adamw", args.lr or (3e-4 if known.workload == "llama" else 6e-4), 0.1) if gpt else \
        ("sgd", args.lr or 0.1, 5e-5)
    module = work.module
    opt = common.build_optimizer(module, kind, lr, wd, fused=not args.no_fused)

    if known.framework == "accelerate":
        from accelerate import Accelerator
        from accelerate.utils import TorchDynamoPlugin

        dynamo = (TorchDynamoPlugin(backend="inductor", mode=args.compile_mode) if args.compile_mode != "none"
                  else TorchDynamoPlugin(backend="no"))
        handlers = []
        if known.fp8:
            from accelerate.utils import AORecipeKwargs

            handlers = [AORecipeKwargs()]
        acc = Accelerator(mixed_precision=("fp8" if known.fp8 else "bf16") if cuda else "no", cpu=not cuda,
                          dynamo_plugin=dynamo, kwargs_handlers=handlers)
        model, opt = acc.prepare(module, opt)
        backward, clip = acc.backward, (lambda: acc.clip_grad_norm_(model.parameters(), args.clip))
    else:
        from lightning.fabric import Fabric

        fabric = Fabric(accelerator="cuda" if cuda else "cpu", devices=1, precision="bf16-mixed" if cuda else "32-true")
        compiled = common.maybe_compile(module, args.compile_mode)
        model, opt = fabric.setup(compiled, opt)
        backward, clip = fabric.backward, (lambda: fabric.clip_gradients(model, opt, max_norm=args.clip))
    sched = common.warmup_cosine(opt, args.schedule_warmup, args.warmup_steps + args.steps)

    def step() -> torch.Tensor:
        x, y = work.batches()
        loss = model(x, y)  # the framework applies autocast
        backward(loss)
        if args.clip > 0:
            clip()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return loss

    timing = common.time_steps(step, device, args.warmup_steps, args.steps, args.windows)
    framework = "HF Accelerate" if known.framework == "accelerate" else "Lightning Fabric"
    name = f"{framework} {dict(gpt='GPT-2', resnet='ResNet-50', llama='Llama-1B')[known.workload]}"
    name += " FP8 (torchao)" if known.fp8 else ""
    return common.report(name, work, timing, device, args, framework=known.framework)


if __name__ == "__main__":
    common.here_on_path()
    main()

"""On the GPU, llama-1b: which trainable parameters does the optimizer miss when it is built before Accelerate's FP8
prepare (the order peer.py used until this session), and none when built after (peer.py now)?"""
import argparse
import sys

sys.path.insert(0, "benchmarks/baselines")
import common  # noqa: E402
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import AORecipeKwargs  # noqa: E402

order = sys.argv[1]  # before | after
work = common.llama_workload(argparse.Namespace(seq=2048, batch=4), torch.device("cuda"))
acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
if order == "before":
    model, opt = acc.prepare(work.module, common.build_optimizer(work.module, "adamw", 3e-4, 0.1, fused=True))
else:
    model = acc.prepare(work.module)
    opt = acc.prepare(common.build_optimizer(model, "adamw", 3e-4, 0.1, fused=True))
n = sum(1 for p in model.parameters() if p.requires_grad)
try:
    common.check_optimizer_covers(model, opt)
    print(f"optimizer built {order} prepare: holds all {n} trainable parameters")
except SystemExit as e:
    print(f"optimizer built {order} prepare ({n} trainable): {e}")

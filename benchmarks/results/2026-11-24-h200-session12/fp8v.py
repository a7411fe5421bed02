"""Run turbotrain's CLI with a variant of torchao's FP8 recipe (env FP8V, '+'-joined), for measurement only:
fastbw (the two backward GEMMs with fast accumulation, as the forward one), all (every linear whose dims are
multiples of 16, as Accelerate converts, instead of torchao's size filter)."""
import dataclasses
import os
import sys

import torchao.float8 as tf8
from torchao.float8.config import Float8GemmConfig, Float8LinearConfig

v = os.environ.get("FP8V", "").split("+")
orig = Float8LinearConfig.from_recipe_name


def patched(name):
    c = orig(name)
    if "fastbw" in v:
        fast = Float8GemmConfig(use_fast_accum=True)
        c = dataclasses.replace(c, gemm_config_grad_input=fast, gemm_config_grad_weight=fast)
    print(f"[fp8v] {v}: out {c.gemm_config_output} gi {c.gemm_config_grad_input} gw {c.gemm_config_grad_weight}",
          flush=True)
    return c


Float8LinearConfig.from_recipe_name = staticmethod(patched)
if "all" in v:
    tf8._auto_filter_for_recipe = lambda recipe, filter_fqns: (
        lambda m, fqn: m.weight.shape[0] % 16 == 0 and m.weight.shape[1] % 16 == 0)

from turbotrain.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))

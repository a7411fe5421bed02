"""Experiment (not shipped): GPT-2 124M's GEMM shapes (B=16 x T=1024) compiled alone, inductor's default (cuBLAS
through aten) against max-autotune with inductor's CUTLASS backend (nvidia-cutlass 4.2 headers, nvcc on the device),
epilogue fusion on. Prints each case's median time and TFLOP/s as it goes."""
import json, statistics, sys
import torch
import torch.nn.functional as F

torch.manual_seed(0)
dev = "cuda"
M = 16 * 1024
bf = torch.bfloat16


def t(*shape):
    return torch.randn(*shape, device=dev, dtype=bf) * 0.02


def linear_case(k, n):
    x, w, b = t(M, k), t(n, k), t(n)
    return (lambda x, w, b: F.linear(x, w, b)), (x, w, b), 2 * M * k * n


def gelu_case(k, n):
    x, w, b = t(M, k), t(n, k), t(n)
    def f(x, w, b):
        h = F.linear(x, w, b)
        return h, F.gelu(h, approximate="tanh")
    return f, (x, w, b), 2 * M * k * n


def dgrad_case(n, k):  # dX[M,k] = dY[M,n] @ W[n,k]
    g, w = t(M, n), t(n, k)
    return (lambda g, w: g @ w), (g, w), 2 * M * k * n


def wgrad_case(n, k):  # dW[n,k] = dY^T[n,M] @ X[M,k]
    g, x = t(M, n), t(M, k)
    return (lambda g, x: g.t() @ x), (g, x), 2 * M * k * n


CASES = {
    "fwd qkv 768->2304": lambda: linear_case(768, 2304),
    "fwd proj 768->768": lambda: linear_case(768, 768),
    "fwd fc 768->3072": lambda: linear_case(768, 3072),
    "fwd fc+gelu 768->3072": lambda: gelu_case(768, 3072),
    "fwd out 3072->768": lambda: linear_case(3072, 768),
    # "fwd head 768->50304": lambda: ((lambda x, w: x @ w.t()), (t(M, 768), t(50304, 768)), 2 * M * 768 * 50304),
    "dgrad qkv": lambda: dgrad_case(2304, 768),
    "dgrad fc": lambda: dgrad_case(3072, 768),
    "wgrad qkv": lambda: wgrad_case(2304, 768),
    "wgrad proj": lambda: wgrad_case(768, 768),
    "dgrad out (fc in)": lambda: dgrad_case(768, 3072),
}

import os
NCFG = int(os.environ.get("NCFG", "8"))
import torch._inductor.config as icfg
icfg.cuda.cutlass_max_profiling_configs = NCFG
VARIANTS = {
    "default": {},
    "cutlass": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,CUTLASS",
                "cuda.cutlass_dir": os.environ["TORCHINDUCTOR_CUTLASS_DIR"],
                "autotune_in_subproc": False},
}


def bench(fn, args, reps=5, iters=50):
    for _ in range(10):
        fn(*args)
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn(*args)
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / iters)
    return statistics.median(out)


only = sys.argv[1:]
for name, make in CASES.items():
    if only and not any(o in name for o in only):
        continue
    fn, args, flops = make()
    row = {"case": name}
    for vname, opts in VARIANTS.items():
        torch._dynamo.reset()
        try:
            cf = torch.compile(fn, options=opts, dynamic=False)
            ms = bench(cf, args)
            row[vname] = [round(ms, 4), round(flops / ms / 1e9, 1)]
        except Exception as e:
            row[vname] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(row), flush=True)

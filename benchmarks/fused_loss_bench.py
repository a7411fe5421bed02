"""GPU benchmark of kernels.fused_loss: LM head + cross-entropy, fused (ours) against torch.compile'd
`F.cross_entropy(h @ W.T)`, under bf16 autocast. Prints one JSON row per (shape, variant): forward+backward
time (CUDA events, after warm-up and compile; median and p10/p90 of 20), peak memory above the inputs, compile
time, and the max abs difference of loss and gradients against an fp32 reference (TF32 off).

Usage (on a CUDA machine): `PYTHONPATH=src python benchmarks/fused_loss_bench.py [--chunk-tokens N] [--iters 20]`
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from turbotrain.accel.fused_loss import fused_linear_cross_entropy

SHAPES = [(16384, 768, 50304), (8192, 2048, 128256)]  # (tokens, D, V): GPT-2 small, Llama-3-1B-like


def unfused(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(h @ w.t(), y)


def inputs(n: int, d: int, v: int, device: torch.device):
    gen = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(n, d, device=device, generator=gen)
    w = torch.randn(v, d, device=device, generator=gen) * 0.02
    y = torch.randint(0, v, (n,), device=device, generator=gen)
    y[::50] = -100  # a few ignored targets, as padding would give
    return h.requires_grad_(), w.requires_grad_(), y


def fwd_bwd(fn, h, w, y):
    h.grad = w.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fn(h, w, y)
    loss.backward()
    return loss.detach().float(), h.grad, w.grad


def reference(h, w, y):
    """fp32 loss and gradients, TF32 off: what the bf16 variants are compared against."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        h.grad = w.grad = None
        loss = unfused(h, w, y)
        loss.backward()
        return loss.detach(), h.grad.clone(), w.grad.clone()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        h.grad = w.grad = None


def measure(name: str, fn, h, w, y, ref, iters: int) -> dict:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fwd_bwd(fn, h, w, y)  # compiles where compiled
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    for _ in range(3):
        fwd_bwd(fn, h, w, y)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fwd_bwd(fn, h, w, y)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    out = None  # drops the earlier gradients: the peak below counts this call's own
    h.grad = w.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fwd_bwd(fn, h, w, y)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    q = statistics.quantiles(times, n=10)
    return {"variant": name, "ms_median": round(statistics.median(times), 3), "ms_p10": round(q[0], 3),
            "ms_p90": round(q[-1], 3), "first_call_s": round(first_s, 2), "peak_mem_above_inputs_mib": peak >> 20,
            "loss": out[0].item(), "loss_abs_diff": abs(out[0].item() - ref[0].item()),
            "grad_h_max_abs_diff": (out[1].float() - ref[1]).abs().max().item(),
            "grad_w_max_abs_diff": (out[2].float() - ref[2]).abs().max().item(),
            "grad_h_ref_max_abs": ref[1].abs().max().item(), "grad_w_ref_max_abs": ref[2].abs().max().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-tokens", type=int, default=None, help="tokens per chunk (default: the op's own)")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU")
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True

    def fused(h, w, y):
        return fused_linear_cross_entropy(h, w, y, chunk_tokens=args.chunk_tokens)

    for n, d, v in SHAPES:
        h, w, y = inputs(n, d, v, device)
        ref = reference(h, w, y)
        variants = {"compiled_F.cross_entropy": torch.compile(unfused), "fused_eager": fused,
                    "fused_compiled": torch.compile(fused, fullgraph=True)}
        for name, fn in variants.items():
            row = {"tokens": n, "d": d, "vocab": v, "chunk_tokens": args.chunk_tokens,
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__}
            print(json.dumps({**row, **measure(name, fn, h, w, y, ref, args.iters)}), flush=True)
        del h, w, y, ref
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

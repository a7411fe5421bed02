"""Which SDPA kernel a compiled graph runs under each way of choosing a backend (torch 2.11, Hopper)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile


def f(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

def kernels(ctx_fn, compiled):
    torch._dynamo.reset()
    q, k, v = (torch.randn(16, 12, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.compile(f) if compiled else f
    with ctx_fn():
        g(q, k, v).backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            g(q, k, v).backward()
            torch.cuda.synchronize()
    names = {e.name[:60] for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    marks = ("flash", "sdpa", "fmha", "attention", "cudnn", "mem_eff", "cutlass")
    return sorted(n for n in names if any(s in n.lower() for s in marks))

F_, C_, E_, M_ = SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH
ways = {
    "torch default": lambda: torch.autograd.profiler.record_function("x"),
    "priority flash first": lambda: sdpa_kernel([F_, C_, E_, M_], set_priority=True),
    "only flash": lambda: sdpa_kernel([F_]),
    "flash+math": lambda: sdpa_kernel([F_, M_]),
    "only efficient": lambda: sdpa_kernel([E_]),
    "priority cudnn first": lambda: sdpa_kernel([C_, F_, E_, M_], set_priority=True),
}
print("default priority order:", torch._C._get_sdp_priority_order())
for name, ctx in ways.items():
    for compiled in (False, True):
        try:
            print(f"{name:22s} compiled={compiled}: {kernels(ctx, compiled)}", flush=True)
        except Exception as e:
            print(f"{name:22s} compiled={compiled}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)

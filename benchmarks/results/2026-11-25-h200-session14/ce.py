"""Head + cross-entropy forward+backward in isolation, one GPU: compiled unfused (what the preset and the peers
run) vs turbotrain's fused loss with its default chunking and with one chunk. Prints ms per call (median of
5 repeats of 20 calls, CUDA events) and each variant's GPU kernels (torch.profiler, ms per call)."""
import statistics, sys, torch, torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
from turbotrain.accel.fused_loss import fused_linear_cross_entropy

def bench(fn, reps=5, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize(); out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n): fn()
        b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b) / n)
    return statistics.median(out), min(out), max(out)

def kernels(fn, n=5):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 1e3 / n, e.count // n) for e in p.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return rows[:12], sum(r[1] for r in rows)

for N, D, V in ((16384, 768, 50304), (8192, 2048, 128256)):
    torch.manual_seed(0)
    h = torch.randn(N, D, device="cuda", requires_grad=True)
    w = (torch.randn(V, D, device="cuda") * 0.02).requires_grad_()
    y = torch.randint(0, V, (N,), device="cuda")
    unfused = torch.compile(lambda h, w, y: F.cross_entropy(F.linear(h, w), y), fullgraph=True)
    fused = torch.compile(lambda h, w, y, c: fused_linear_cross_entropy(h, w, y, chunk_tokens=c), fullgraph=True)
    variants = {"compiled unfused": lambda: unfused(h, w, y), "fused default chunk": lambda: fused(h, w, y, None),
                "fused one chunk": lambda: fused(h, w, y, N)}
    print(f"\n## N={N} D={D} V={V} (bf16 autocast, fp32 master h and W)", flush=True)
    for name, f in variants.items():
        def step(f=f):
            h.grad = w.grad = None
            with torch.autocast("cuda", torch.bfloat16):
                loss = f()
            loss.backward()
        torch.cuda.reset_peak_memory_stats()
        med, lo, hi = bench(step)
        peak = torch.cuda.max_memory_allocated() / 2**30
        rows, tot = kernels(step)
        print(f"{name}: {med:.3f} ms/call (min {lo:.3f}, max {hi:.3f}), peak {peak:.2f} GiB, kernel sum {tot:.3f} ms", flush=True)
        for k, ms, c in rows:
            print(f"    {ms:7.3f} ms  x{c:<3d} {k[:110]}")

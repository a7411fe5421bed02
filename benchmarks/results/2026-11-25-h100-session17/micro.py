"""Call 1 (session 17): the two convnet levers in isolation and in a whole compiled ResNet-50 step."""
import json, statistics, sys, time
import torch, torch.nn.functional as F
from torch import nn
from turbotrain.accel import max_pool
from turbotrain.accel.conv_stem import swap_stems, space_to_depth_conv
from turbotrain.models.resnet import ResNet

torch.backends.cudnn.benchmark = True
dev = "cuda"
res = {}

def timeit(fn, n=50, warm=10):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n): fn()
        e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / n)
    return statistics.median(ts)

# ---- max pool: exactness against CUDA's own kernel, then speed
def pool_exact(shape, k, s, p, dt, special):
    x = torch.randn(shape, device=dev)
    if special:
        x = (x * 2).round(); x.view(-1)[::7] = float("-inf"); x.view(-1)[::13] = float("nan")
    x = x.to(dt).contiguous(memory_format=torch.channels_last)
    a = x.clone().requires_grad_(); b = x.clone().requires_grad_()
    ra, ia = F.max_pool2d(a, k, s, p, return_indices=True)
    rb = max_pool.MaxPool2dNHWC(k, s, p)(b)
    g = torch.randn_like(ra)
    ra.backward(g); rb.backward(g)
    return dict(out=torch.equal(ra.nan_to_num(7.), rb.nan_to_num(7.)), grad=torch.equal(a.grad, b.grad),
                cl=rb.is_contiguous(memory_format=torch.channels_last))
res["pool_exact"] = [pool_exact(*c) for c in [
    ((4, 64, 112, 112), 3, 2, 1, torch.bfloat16, True), ((4, 64, 112, 112), 3, 2, 1, torch.bfloat16, False),
    ((3, 130, 17, 15), 3, 2, 1, torch.float16, True), ((2, 33, 20, 21), 2, 2, 0, torch.float32, True),
    ((2, 64, 19, 19), 5, 3, 2, torch.bfloat16, True), ((2, 8, 12, 12), 3, 1, 1, torch.float32, True)]]
print("pool exact", res["pool_exact"], flush=True)

x = torch.randn(256, 64, 112, 112, device=dev, dtype=torch.bfloat16).relu().contiguous(memory_format=torch.channels_last)
x.requires_grad_()
g = torch.randn(256, 64, 56, 56, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
plain = nn.MaxPool2d(3, 2, 1); ours = max_pool.MaxPool2dNHWC(3, 2, 1)
def fb(m):
    def f():
        y = m(x); y.backward(g); x.grad = None
    return f
cplain = torch.compile(plain); cours = torch.compile(ours)
res["pool_ms"] = {name: timeit(fb(m)) for name, m in
                  [("eager_torch", plain), ("compiled_inductor", cplain), ("eager_ours", ours), ("compiled_ours", cours)]}
print("pool ms fwd+bwd", res["pool_ms"], flush=True)

# ---- stem conv: speed of the space-to-depth form, eager and compiled (forward + weight gradient)
xs = torch.randn(256, 3, 224, 224, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
w = torch.randn(64, 3, 7, 7, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last).requires_grad_()
gs = torch.randn(256, 64, 112, 112, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
conv = lambda: F.conv2d(xs, w, None, 2, 3)
s2d = lambda: space_to_depth_conv(xs, w, None, (3, 3))
cconv = torch.compile(lambda: F.conv2d(xs, w, None, 2, 3)); cs2d = torch.compile(lambda: space_to_depth_conv(xs, w, None, (3, 3)))
def fbs(f):
    def g_():
        y = f(); y.backward(gs); w.grad = None
    return g_
res["stem_ms"] = {n: timeit(fbs(f), n=20) for n, f in [("eager_conv", conv), ("eager_s2d", s2d), ("compiled_conv", cconv), ("compiled_s2d", cs2d)]}
res["stem_fwd_ms"] = {n: timeit(f, n=20) for n, f in [("eager_conv", lambda: conv().detach()), ("eager_s2d", lambda: s2d().detach())]}
with torch.no_grad():
    xf, wf = xs.float(), w.float()
    torch.backends.cudnn.allow_tf32 = False
    d = (F.conv2d(xf, wf, None, 2, 3) - space_to_depth_conv(xf, wf, None, (3, 3))).abs().max().item()
    torch.backends.cudnn.allow_tf32 = True
res["stem_fp32_maxdiff"] = d
print("stem ms", res["stem_ms"], res["stem_fwd_ms"], "fp32 max diff", d, flush=True)

# ---- whole compiled ResNet-50 step (bf16 autocast, channels_last, SGD momentum, CUDA graphs), variants
def step_rate(variant):
    torch.manual_seed(0)
    m = ResNet([3, 4, 6, 3], 1000, 3, 64).to(dev).to(memory_format=torch.channels_last)
    if "stem" in variant: swap_stems(m)
    if "pool" in variant: max_pool.swap_max_pools(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5, fused=True)
    xb = torch.randn(256, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
    yb = torch.randint(0, 1000, (256,), device=dev)
    class WL(nn.Module):
        def __init__(s, m): super().__init__(); s.m = m
        def forward(s, x, y):
            with torch.autocast("cuda", torch.bfloat16):
                return F.cross_entropy(s.m(x), y)
    f = torch.compile(WL(m), mode="reduce-overhead")
    def step():
        loss = f(xb, yb); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
    t0 = time.time(); step(); step(); torch.cuda.synchronize(); comp = time.time() - t0
    for _ in range(20): step()
    torch.cuda.synchronize()
    ws = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(20): loss = step()
        torch.cuda.synchronize(); ws.append(20 * 256 / (time.perf_counter() - t))
    return dict(img_s=statistics.median(ws), lo=min(ws), hi=max(ws), compile_s=round(comp, 1), loss=loss.item(),
                peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))
res["step"] = {}
for v in ["base", "stem", "pool", "stem+pool", "base#2"]:
    torch.cuda.reset_peak_memory_stats()
    res["step"][v] = step_rate(v)
    print("step", v, res["step"][v], flush=True)
print(json.dumps(res))

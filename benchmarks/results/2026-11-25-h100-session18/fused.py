"""Session 18 call A: batch norm + ReLU + max pool fused vs unfused (compiled), stem shape, bf16 channels_last."""
import json, os, statistics, sys
import torch, torch.nn.functional as F
from torch import nn
from turbotrain.accel.convnet import bn_relu_pool, max_pool

torch.backends.cudnn.benchmark = True
dev = "cuda"
res = {}

def timeit(fn, n=30, warm=10):
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

def section(kind):
    seq = nn.Sequential(nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)).cuda()
    if kind == "pool":
        max_pool.set_max_pools(seq, True)
    elif kind == "fused":
        assert bn_relu_pool.set_fused(seq, True) == 1
    return seq

N = int(os.environ.get("N", 256))
x = torch.randn(N, 64, 112, 112, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
x.requires_grad_()
g = torch.randn(N, 64, 56, 56, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
def fb(m):
    def f():
        y = m(x); y.backward(g); x.grad = None
    return f
def fwd(m):
    def f():
        with torch.no_grad(): m(x)
    return f
res["ms"] = {}
for kind in ("inductor", "pool", "fused"):
    m = torch.compile(section(kind))
    res["ms"][kind] = {"fwd+bwd": timeit(fb(m)), "fwd_nograd": timeit(fwd(m))}
    print(kind, res["ms"][kind], flush=True)
# pieces of the fused op
from turbotrain.accel.convnet import bn_relu_pool_kernels as K
xd = x.detach()
w = torch.randn(64, device=dev); b = torch.randn(64, device=dev)
mean, var = K.batch_stats(xd)
out, off, xm = bn_relu_pool._empty_outputs(xd, [3, 3], [2, 2], [1, 1])
dx = torch.empty_like(xd)
res["pieces_ms"] = {
    "stats": timeit(lambda: K.batch_stats(xd)),
    "apply_pool": timeit(lambda: K.forward(xd, mean, var, w, b, 1e-5, out, off, xm, [3, 3], [2, 2], [1, 1])),
    "backward": timeit(lambda: K.backward(g, off, xd, xm, mean, var, w, b, 1e-5, True, dx, [3, 3], [2, 2], [1, 1])),
}
print("pieces", res["pieces_ms"], flush=True)
# block-size sweep of the fused kernels (launcher blocks overridden)
sweep = {}
orig = K._blocks
for bp_total in (2048, 4096, 8192):
    for bc in (32, 64):
        K._blocks = lambda c, bp_total=bp_total, bc=bc: (max(1, bp_total // bc), bc)
        for rows in (1024, 2048, 4096):
            K.ROWS = rows
            try:
                sweep[f"{bp_total}/{bc}/rows{rows}"] = {
                    "stats": timeit(lambda: K.batch_stats(xd), n=10, warm=3),
                    "apply_pool": timeit(lambda: K.forward(xd, mean, var, w, b, 1e-5, out, off, xm, [3, 3], [2, 2], [1, 1]), n=10, warm=3),
                    "backward": timeit(lambda: K.backward(g, off, xd, xm, mean, var, w, b, 1e-5, True, dx, [3, 3], [2, 2], [1, 1]), n=10, warm=3)}
            except Exception as e:
                sweep[f"{bp_total}/{bc}/rows{rows}"] = repr(e)[:200]
K._blocks = orig; K.ROWS = 2048
res["sweep"] = sweep
for k_, v in sweep.items(): print(k_, v)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "fused.json"), "w"), indent=1)

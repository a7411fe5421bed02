"""Session 18 call A2: launch-shape sweep of the fused batch norm + ReLU + max pool kernels at ResNet-50's stem
(B=256, 64 x 112 x 112, bf16 channels_last), each kernel timed alone; then the section fused vs unfused."""
import itertools, json, os, statistics, time
import torch
from torch import nn
from turbotrain.accel.convnet import bn_relu_pool, max_pool
from turbotrain.accel.convnet import bn_relu_pool_kernels as K

dev = "cuda"
def timeit(fn, n=20, warm=3, reps=5):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n): fn()
        e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / n)
    return statistics.median(ts)

x = torch.randn(256, 64, 112, 112, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
g = torch.randn(256, 64, 56, 56, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
w = torch.randn(64, device=dev); b = torch.randn(64, device=dev)
mean, var = K.batch_stats(x)
out, off, xm = bn_relu_pool._empty_outputs(x, [3, 3], [2, 2], [1, 1])
K.forward(x, mean, var, w, b, 1e-5, out, off, xm, [3, 3], [2, 2], [1, 1])
dx = torch.empty_like(x)
s1 = torch.zeros(64, device=dev); s2 = torch.zeros(64, device=dev)
windows = [2, 2]
runs = {
    "stats": lambda: K._channel_sums(K.stats_partial, "stats", 256 * 112 * 112, 64, x),
    "sums": lambda: K._channel_sums(K.grad_sums_partial, "sums", 256 * 56 * 56, 64, g, xm, mean, var, w, b, 1e-5),
    "apply": lambda: K._launch(K.apply_pool, "apply", 256 * 56 * 56, 64, x, mean, var, w, b, out, off, xm, 1e-5,
                               256 * 56 * 56, 64, 112, 112, 56, 56, 3, 3, 2, 2, 1, 1),
    "grad": lambda: K._launch(K.grad_input, "grad", 256 * 112 * 112, 64, g, off, x, mean, var, w, b, s1, s2, dx,
                              1e-5, float(256 * 112 * 112), 256 * 112 * 112, 64, 112, 112, 56, 56, True,
                              3, 3, 2, 2, 1, 1, 2, 2),
}
res = {"default": {k: timeit(f) for k, f in runs.items()}}
print("default", res["default"], flush=True)
t0 = time.time()
for name in ("stats", "sums", "apply", "grad"):
    res[name] = {}
    rows_opts = (512, 2048, 8192) if name in ("stats", "sums") else (0,)
    for elements, most, warps, rows in itertools.product((1024, 2048, 4096, 8192), (32, 64), (4, 8), rows_opts):
        if time.time() - t0 > float(os.environ.get("SWEEP_S", 200)): break
        K.TILES[name] = (elements, most, warps)
        if rows: K.ROWS = rows
        key = f"{elements}/{most}/w{warps}" + (f"/r{rows}" if rows else "")
        try:
            res[name][key] = timeit(runs[name])
        except Exception as e:
            res[name][key] = repr(e)[:120]
        K.ROWS = 2048
    K.TILES[name] = (4096, 64, 4)
    best = sorted((v, k) for k, v in res[name].items() if isinstance(v, float))[:4]
    print(name, "best", best, flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "sweep.json"), "w"), indent=1)

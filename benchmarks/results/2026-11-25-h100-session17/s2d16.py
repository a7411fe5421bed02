"""Session 17 call 6: the space-to-depth stem with its 12 channels zero-padded to 16 (cuDNN pads 12 -> 16 itself in
an extra kernel) vs as shipped vs the plain conv; compiled, forward + weight gradient, bf16 channels_last, B=256."""
import statistics, torch, torch.nn.functional as F
from turbotrain.accel.convnet import stem
torch.backends.cudnn.benchmark = True
orig = stem._fold
def fold16(t, nhwc):
    t = orig(t, nhwc)
    return F.pad(t, (0, 0, 0, 0, 0, (-t.shape[1]) % 16)).contiguous(memory_format=torch.channels_last)
xs = torch.randn(256, 3, 224, 224, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
w = torch.randn(64, 3, 7, 7, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last).requires_grad_()
gs = torch.randn(256, 64, 112, 112, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
def timeit(fn, n=20):
    for _ in range(5): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n): fn()
        b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / n)
    return statistics.median(ts)
def fb(f):
    def g():
        f().backward(gs); w.grad = None
    return g
res = {}
res["conv"] = timeit(fb(torch.compile(lambda: F.conv2d(xs, w, None, 2, 3))))
res["s2d12"] = timeit(fb(torch.compile(lambda: stem.space_to_depth_conv(xs, w, None, (3, 3)))))
stem._fold = fold16
torch._dynamo.reset()
res["s2d16"] = timeit(fb(torch.compile(lambda: stem.space_to_depth_conv(xs, w, None, (3, 3)))))
with torch.no_grad():
    d = (stem.space_to_depth_conv(xs.float(), w.float(), None, (3, 3)) - F.conv2d(xs.float(), w.float(), None, 2, 3)).abs().max().item()
print({k: round(v, 3) for k, v in res.items()}, "ms fwd+wgrad; s2d16 fp32 max diff", d)

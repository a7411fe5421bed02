"""ResNet-50's stem (conv 7x7/2 3->64, BN, ReLU, max pool) forward + backward on [256, 3, 224, 224] bf16 channels_last,
compiled (default mode) as in the model: the input as it is (3 channels: cuDNN pads to 8 on every call) vs the input
and the weight zero-padded to 4 or 8 channels in the graph (same math: the added channels are zeros)."""
import statistics, torch, torch.nn as nn, torch.nn.functional as F
torch.backends.cudnn.benchmark = True
def t(fn, reps=7, n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize(); out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n): fn()
        b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b) / n)
    return statistics.median(out)
conv = nn.Conv2d(3, 64, 7, 2, 3, bias=False).cuda().to(memory_format=torch.channels_last)
bn = nn.BatchNorm2d(64).cuda()
x = torch.randn(256, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
def stem(x, pad):
    w = conv.weight
    if pad:
        x = F.pad(x, (0, 0, 0, 0, 0, pad)).contiguous(memory_format=torch.channels_last)
        w = F.pad(w, (0, 0, 0, 0, 0, pad))
    return F.max_pool2d(F.relu(bn(F.conv2d(x, w, None, 2, 3))), 3, 2, 1)
res = {}
for pad in (0, 1, 5):
    f = torch.compile(lambda x, pad=pad: stem(x, pad))
    def step(f=f):
        conv.weight.grad = None
        with torch.autocast("cuda", torch.bfloat16):
            y = f(x)
        y.float().sum().backward()
    ms = t(step); step(); res[pad] = (y := None, conv.weight.grad.clone())[1]
    print(f"input channels {3 + pad}: forward + backward {ms:.3f} ms", flush=True)
print("weight grads, pad 1 vs 0: max abs diff", (res[1] - res[0]).abs().max().item(), "of", res[0].abs().max().item())

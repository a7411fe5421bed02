"""Session 29 microbenchmark: TritonAdamW + grad_sq_sum vs torch's fused AdamW + foreach norm, GPT-2 124M's
parameter shapes, fp32. Checks values against torch's foreach AdamW, then times each step (CUDA events, median)."""
import statistics, sys, time
import torch
from turbotrain.accel import triton_adamw as ta
from turbotrain.accel.optim import clip_grad_norm
from turbotrain.models.gpt import GPT

torch.manual_seed(0)
dev = torch.device("cuda")
model = GPT(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768).to(dev)
shapes = [p.shape for p in model.parameters()]
print("micro params", sum(p.numel() for p in model.parameters()), "tensors", len(shapes))
del model

def make(seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s, device=dev, generator=g)) for s in shapes]
    return ps

def groups(ps):
    return [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]

def grads_for(ps, step):
    g = torch.Generator(device=dev).manual_seed(1000 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, device=dev, generator=g) * 0.01

def run(kind, steps=3, clip=1.0):
    ps = make(1)
    if kind == "triton":
        opt = ta.TritonAdamW(groups(ps), lr=6e-4, betas=(0.9, 0.95))
    else:
        opt = torch.optim.AdamW(groups(ps), lr=6e-4, betas=(0.9, 0.95), **({"fused": True} if kind == "fused" else {"foreach": True}))
    for s in range(steps):
        grads_for(ps, s)
        n = clip_grad_norm(ps, clip, opt=opt if kind != "foreach" else None)
        opt.step(); opt.__dict__.pop("grad_scale", None)
    return ps, opt, n

ref, _, nref = run("foreach")
for kind in ("fused", "triton"):
    ps, opt, n = run(kind)
    d = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(ps, ref))
    print(f"micro check {kind}: max rel diff of params to foreach after 3 steps {d:.2e}; norm {n.item():.6f} vs {nref.item():.6f}")

def timeit(fn, n=30):
    for _ in range(5): fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)

for kind in ("fused", "triton", "fused", "triton"):
    ps = make(2); grads_for(ps, 0)
    opt = ta.TritonAdamW(groups(ps), lr=6e-4, betas=(0.9, 0.95)) if kind == "triton" else torch.optim.AdamW(groups(ps), lr=6e-4, betas=(0.9, 0.95), fused=True)
    scale = torch.ones((), device=dev)
    def step():
        opt.grad_scale = scale; opt.step()
    def norm():
        clip_grad_norm(ps, 1.0, opt=opt); opt.__dict__.pop("grad_scale", None)
    def both():
        clip_grad_norm(ps, 1.0, opt=opt); opt.step(); opt.__dict__.pop("grad_scale", None)
    print(f"micro {kind}: step {timeit(step):.3f} ms, norm+fold {timeit(norm):.3f} ms, both {timeit(both):.3f} ms")
    t0 = time.perf_counter(); [both() for _ in range(20)]; host = (time.perf_counter() - t0) / 20 * 1e3
    torch.cuda.synchronize(); print(f"micro {kind}: host time a step (norm + step, no sync) {host:.3f} ms")
for block, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (16384, 16)):
    ta.BLOCK, ta._WARPS = block, warps
    ps = make(2); grads_for(ps, 0)
    opt = ta.TritonAdamW(groups(ps), lr=6e-4, betas=(0.9, 0.95)); scale = torch.ones((), device=dev)
    def both():
        clip_grad_norm(ps, 1.0, opt=opt); opt.step(); opt.__dict__.pop("grad_scale", None)
    def step():
        opt.grad_scale = scale; opt.step()
    print(f"micro block {block} warps {warps}: step {timeit(step):.3f} ms, both {timeit(both):.3f} ms")

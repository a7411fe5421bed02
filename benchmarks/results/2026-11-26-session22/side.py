"""Upper bound of a side-stream weight gradient: GPT-2 124M (turbotrain's model), eager bf16, whole step in one
CUDA graph (forward, backward, clip, fused AdamW). A: nn.Linear under autocast. C: a Linear Function computing
dgrad, wgrad, bias grad on the main stream. B: the same Function with wgrad + bias grad on a side stream (joined
after backward). Medians of replays timed by events, A C B A C B."""
import faulthandler, statistics, sys, time
faulthandler.enable()
import torch, torch.nn.functional as F
from torch import nn
from turbotrain.models import gpt

SIDE = torch.cuda.Stream()


class Lin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, side):
        xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
        ctx.save_for_backward(xb, wb)
        ctx.side, ctx.has_b = side, b is not None
        return F.linear(xb, wb, None if b is None else b.to(torch.bfloat16))

    @staticmethod
    def backward(ctx, g):
        xb, wb = ctx.saved_tensors
        g2, x2 = g.reshape(-1, g.shape[-1]), xb.reshape(-1, xb.shape[-1])
        if ctx.side:
            SIDE.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(SIDE):
                gw = (g2.t() @ x2).float()
                gb = g2.sum(0, dtype=torch.float32) if ctx.has_b else None
            g2.record_stream(SIDE); x2.record_stream(SIDE)
        else:
            gw = (g2.t() @ x2).float()
            gb = g2.sum(0, dtype=torch.float32) if ctx.has_b else None
        gx = g @ wb
        return gx, gw, gb, None


class SideLinear(nn.Linear):
    side = False
    def forward(self, x):
        return Lin.apply(x, self.weight, self.bias, SideLinear.side)


def build(custom):
    torch.manual_seed(0)
    m = gpt.build().cuda()
    if custom:
        for blk in m.blocks:
            for n in ("qkv", "proj", "fc", "out"):
                old = getattr(blk, n); new = SideLinear(old.in_features, old.out_features, device="cuda")
                new.weight, new.bias = old.weight, old.bias
                setattr(blk, n, new)
    return m


def graphed(m, x, y):
    params = list(m.parameters())
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), fused=True, capturable=True)
    def step():
        with torch.autocast("cuda", torch.bfloat16):
            logits = m(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        if SideLinear.side:
            torch.cuda.current_stream().wait_stream(SIDE)
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step(); opt.zero_grad(set_to_none=True)
        return loss
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        out = step()
    return g, out, opt


def time_graph(g, n=60):
    for _ in range(5): g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n // 3): g.replay()
        b.record(); b.synchronize(); ts.append(a.elapsed_time(b) / (n // 3))
    return statistics.median(ts)


x = torch.randint(0, 50304, (16, 1024), device="cuda"); y = torch.randint(0, 50304, (16, 1024), device="cuda")
variants = {"A autocast nn.Linear": (False, False), "C Function, one stream": (True, False),
            "B Function, wgrad on side stream": (True, True)}
graphs = {}
for name, (custom, side) in variants.items():
    SideLinear.side = side
    m = build(custom)
    g, out, opt = graphed(m, x, y)
    g.replay(); torch.cuda.synchronize()
    graphs[name] = (g, out, m, opt)
    print(name, 'alone', round(time_graph(g), 3), flush=True)
    print(name, "loss after 5 graph steps:", end=" ")
    for _ in range(4): g.replay()
    torch.cuda.synchronize(); print(round(out.item(), 5), flush=True)
res = {k: [] for k in graphs}
for rnd in range(3):
    for name, (g, *_) in graphs.items():
        res[name].append(time_graph(g)); print(rnd, name, round(res[name][-1], 3), flush=True)
for name, v in res.items():
    print(f"{name:36s} ms/step {' '.join(f'{t:.3f}' for t in v)}  median {statistics.median(v):.3f}  tok/s {16384 / statistics.median(v) * 1e3:,.0f}")

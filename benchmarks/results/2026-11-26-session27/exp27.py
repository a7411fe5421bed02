"""Experiments, session 27: three rewrites of GPT-2's block, measured through the real preset (calls 1-3).

packed (shipped since as kernels.packed_attention, src/turbotrain/models/packed_attention.py): attention as one op
  over the fused qkv projection's output. torch's SDPA backward returns dq, dk, dv as three tensors and the split's
  backward concatenates them (a copy of the whole qkv gradient, 0.42 ms a step). Here cuDNN's SDPA (through
  cudnn-frontend's graph API) writes dq, dk, dv straight into one [B, T, 3C] buffer. +1.8 to +2.2 %.
aug (not shipped, -2 %): the bias of qkv, fc and out carried as a column of the weight, the input given a column of
  ones, so the weight-gradient GEMM computes the bias gradient in its accumulator. K grows from 768 to 776 (3072 to
  3080), and the ones column costs a copy of each GEMM input (inductor does not fuse the cat into its producer).
gelu (not shipped, -4 %): a bias + GELU Triton op whose backward writes dh and the bias gradient's column partial sums
  in one pass; its untuned kernel ran 0.22 ms a layer against inductor's 0.115 for the pair it replaces.

install(name) patches turbotrain's GPT Block.forward ("packed", "aug", "gelu", combined with "+"); micro() checks
and times the packed op against torch's SDPA and the GELU op against inductor's."""
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

_HANDLES, _GRAPHS = {}, {}


def _cudnn():
    import cudnn
    return cudnn


def _handle():
    cudnn = _cudnn()
    dev = torch.cuda.current_device()
    if dev not in _HANDLES:
        _HANDLES[dev] = cudnn.create_handle()
    cudnn.set_stream(handle=_HANDLES[dev], stream=torch.cuda.current_stream().cuda_stream)
    return _HANDLES[dev]


def _views(qkv, h):
    b, t, c3 = qkv.shape
    d = c3 // 3 // h
    z = qkv.view(b, t, 3, h, d)
    return [z[:, :, i].transpose(1, 2) for i in range(3)]  # (B, H, T, D), strides (T*3C, D, 3C, 1)


def _build(kind, b, t, h, d):
    cudnn = _cudnn()
    bf, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=bf, intermediate_data_type=f32, compute_data_type=f32, handle=_handle())
    c = h * d
    qkv_stride = [t * 3 * c, d, 3 * c, 1]
    o_stride = [t * c, d, c, 1]
    dims = [b, h, t, d]
    q, k, v = (g.tensor(name=n, dim=dims, stride=qkv_stride, data_type=bf) for n in "qkv")
    scale = 1.0 / math.sqrt(d)
    if kind == "fwd":
        try:
            o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=scale, use_causal_mask=True)
        except TypeError:
            o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, is_inference=False, attn_scale=scale, use_causal_mask=True)
        o.set_output(True).set_dim(dims).set_stride(o_stride).set_data_type(bf)
        stats.set_output(True).set_dim([b, h, t, 1]).set_stride([h * t, t, 1, 1]).set_data_type(f32)
        io = (q, k, v, o, stats)
    else:
        o = g.tensor(name="o", dim=dims, stride=o_stride, data_type=bf)
        do = g.tensor(name="do", dim=dims, stride=o_stride, data_type=bf)
        stats = g.tensor(name="stats", dim=[b, h, t, 1], stride=[h * t, t, 1, 1], data_type=f32)
        dq, dk, dv = g.sdpa_backward(name="sdpa_bwd", q=q, k=k, v=v, o=o, dO=do, stats=stats, attn_scale=scale,
                                     use_causal_mask=True)
        for z in (dq, dk, dv):
            z.set_output(True).set_dim(dims).set_stride(qkv_stride).set_data_type(bf)
        io = (q, k, v, o, do, stats, dq, dk, dv)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, io, g.get_workspace_size()


def _graph(kind, b, t, h, d):
    key = (kind, b, t, h, d, torch.cuda.current_device())
    if key not in _GRAPHS:
        _GRAPHS[key] = _build(kind, b, t, h, d)
    return _GRAPHS[key]


@torch.library.custom_op("ttx::qkv_attn_fwd", mutates_args=())
def qkv_attn_fwd(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    b, t, c3 = qkv.shape
    c = c3 // 3
    g, (q, k, v, o, stats), ws = _graph("fwd", b, t, n_head, c // n_head)
    out = qkv.new_empty(b, t, c)
    st = torch.empty(b, n_head, t, 1, device=qkv.device, dtype=torch.float32)
    qv, kv, vv = _views(qkv, n_head)
    work = torch.empty(max(ws, 1), device=qkv.device, dtype=torch.uint8)
    g.execute({q: qv, k: kv, v: vv, o: out.view(b, t, n_head, -1).transpose(1, 2), stats: st}, work, handle=_handle())
    return out, st


@qkv_attn_fwd.register_fake
def _(qkv, n_head):
    b, t, c3 = qkv.shape
    return qkv.new_empty(b, t, c3 // 3), qkv.new_empty(b, n_head, t, 1, dtype=torch.float32)


@torch.library.custom_op("ttx::qkv_attn_bwd", mutates_args=())
def qkv_attn_bwd(do: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, st: torch.Tensor, n_head: int) -> torch.Tensor:
    b, t, c3 = qkv.shape
    c = c3 // 3
    g, (q, k, v, o, dot, stats, dq, dk, dv), ws = _graph("bwd", b, t, n_head, c // n_head)
    do = do.contiguous()
    dqkv = torch.empty_like(qkv)
    qv, kv, vv = _views(qkv, n_head)
    dqv, dkv, dvv = _views(dqkv, n_head)
    hv = lambda z: z.view(b, t, n_head, -1).transpose(1, 2)  # noqa: E731
    work = torch.empty(max(ws, 1), device=qkv.device, dtype=torch.uint8)
    g.execute({q: qv, k: kv, v: vv, o: hv(out), dot: hv(do), stats: st, dq: dqv, dk: dkv, dv: dvv}, work,
              handle=_handle())
    return dqkv


@qkv_attn_bwd.register_fake
def _(do, qkv, out, st, n_head):
    return torch.empty_like(qkv)


def _setup(ctx, inputs, output):
    qkv, n_head = inputs
    out, st = output
    ctx.save_for_backward(qkv, out, st)
    ctx.n_head = n_head


def _backward(ctx, dout, dst):
    qkv, out, st = ctx.saved_tensors
    return qkv_attn_bwd(dout, qkv, out, st, ctx.n_head), None


torch.library.register_autograd("ttx::qkv_attn_fwd", _backward, setup_context=_setup)


def qkv_attention(qkv, n_head):
    if not qkv.is_cuda:  # cuDNN only: a CPU check of the model runs torch's SDPA
        b, t, c3 = qkv.shape
        q, k, v = (z.transpose(1, 2) for z in qkv.view(b, t, 3, n_head, -1).unbind(2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c3 // 3)
    return qkv_attn_fwd(qkv.contiguous(), n_head)[0]


_K0, _K1 = 0.7978845608028654, 0.044715  # sqrt(2/pi), the tanh GELU's cubic coefficient


def _gelu_kernels():
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def fwd(h_ptr, b_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        offs = rm[:, None].to(tl.int64) * N + rn[None, :]
        x = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x = x + tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        t = libdevice.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
        tl.store(y_ptr + offs, (0.5 * x * (1.0 + t)).to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def bwd(dy_ptr, h_ptr, b_ptr, dh_ptr, part_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        pm = tl.program_id(0)
        rm = pm * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        offs = rm[:, None].to(tl.int64) * N + rn[None, :]
        x = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x = x + tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x2 = x * x
        t = libdevice.tanh(0.7978845608028654 * (x + 0.044715 * x2 * x))
        d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x2)
        dh = tl.where(mask, dy * d, 0.0)
        tl.store(dh_ptr + offs, dh.to(dh_ptr.dtype.element_ty), mask=mask)
        tl.store(part_ptr + pm * N + rn, tl.sum(dh, 0), mask=rn < N)

    return fwd, bwd


_GK = []
BM_F, BN_F, BM_B, BN_B = int(os.environ.get("GBMF", 32)), int(os.environ.get("GBNF", 128)), \
    int(os.environ.get("GBMB", 64)), int(os.environ.get("GBNB", 128))


def _ref_gelu_bwd(dy, h, b):
    x = h.float() + b.float()
    t = torch.tanh(_K0 * (x + _K1 * x ** 3))
    d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _K0 * (1 + 3 * _K1 * x * x)
    dh = dy.float() * d
    return dh.to(h.dtype), dh.sum(0).to(b.dtype)


@torch.library.custom_op("ttx::bias_gelu", mutates_args=())
def bias_gelu_op(h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not h.is_cuda:
        return F.gelu(h.float() + b.float(), approximate="tanh").to(h.dtype)
    if not _GK:
        _GK.extend(_gelu_kernels())
    m, n = h.shape
    y = torch.empty_like(h)
    _GK[0][(triton_cdiv(m, BM_F), triton_cdiv(n, BN_F))](h, b, y, m, n, BM=BM_F, BN=BN_F)
    return y


def triton_cdiv(a, b):
    return (a + b - 1) // b


@bias_gelu_op.register_fake
def _(h, b):
    return torch.empty_like(h)


@torch.library.custom_op("ttx::bias_gelu_bwd", mutates_args=())
def bias_gelu_bwd(dy: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not h.is_cuda:
        return _ref_gelu_bwd(dy, h, b)
    if not _GK:
        _GK.extend(_gelu_kernels())
    m, n = h.shape
    dy = dy.contiguous()
    dh = torch.empty_like(h)
    gm = triton_cdiv(m, BM_B)
    part = torch.empty(gm, n, device=h.device, dtype=torch.float32)
    _GK[1][(gm, triton_cdiv(n, BN_B))](dy, h, b, dh, part, m, n, BM=BM_B, BN=BN_B)
    return dh, part.sum(0).to(b.dtype)


@bias_gelu_bwd.register_fake
def _(dy, h, b):
    return torch.empty_like(h), torch.empty_like(b)


def _gsetup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _gbackward(ctx, dy):
    h, b = ctx.saved_tensors
    return bias_gelu_bwd(dy, h, b)


torch.library.register_autograd("ttx::bias_gelu", _gbackward, setup_context=_gsetup)


def fc_gelu(lin, x):
    """gelu(x @ W.T + b) with the bias added in the GELU kernel, whose backward also sums the bias gradient."""
    dev = x.device.type
    h = F.linear(x, lin.weight)
    b = lin.bias.to(h.dtype)
    return bias_gelu_op(h.reshape(-1, h.shape[-1]), b).view(h.shape)


def _aug_x(h, pad):
    return torch.cat([h, h.new_ones(*h.shape[:-1], 1), h.new_zeros(*h.shape[:-1], pad - 1)], -1)


def _aug_w(lin, pad):
    w = lin.weight
    return torch.cat([w, lin.bias[:, None], w.new_zeros(w.shape[0], pad - 1)], 1)


def install(name):
    from turbotrain.models import gpt

    packed, aug, gelu = "packed" in name, "aug" in name, "gelu" in name

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        qkv = F.linear(_aug_x(h, 8), _aug_w(self.qkv, 8)) if aug else self.qkv(h)
        if packed:
            y = qkv_attention(qkv, self.n_head)
        else:
            q, k, v = qkv.split(d, dim=2)
            q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        if aug:
            g = F.gelu(F.linear(_aug_x(self.ln2(x), 8), _aug_w(self.fc, 8)), approximate="tanh")
            return x + F.linear(_aug_x(g, 8), _aug_w(self.out, 8))
        if gelu:
            return x + self.out(fc_gelu(self.fc, self.ln2(x)))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    gpt.Block.forward = forward
    print(f"exp27: Block.forward = {name}", flush=True)


def _bench(fn, reps=5, iters=20):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / iters)
    return statistics.median(out)


def micro():
    torch.manual_seed(0)
    b, t, h, d = 16, 1024, 12, 64
    c = h * d
    qkv = (torch.randn(b, t, 3 * c, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(b, t, c, device="cuda").to(torch.bfloat16)

    def ref():
        q, k, v = qkv.split(c, dim=2)
        q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        return y, torch.autograd.grad(y, qkv, dy)[0]

    def ours():
        y = qkv_attention(qkv, h)
        return y, torch.autograd.grad(y, qkv, dy)[0]

    y0, g0 = ref()
    y1, g1 = ours()
    qkv64 = qkv.detach().double().requires_grad_()
    q, k, v = qkv64.split(c, dim=2)
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
    y64 = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
    g64 = torch.autograd.grad(y64, qkv64, dy.double())[0]
    rel = lambda a, r: ((a.double() - r).norm() / r.norm()).item()  # noqa: E731
    print(f"micro: out rel err vs fp64: torch {rel(y0, y64):.3e} ours {rel(y1, y64):.3e}; "
          f"dqkv: torch {rel(g0, g64):.3e} ours {rel(g1, g64):.3e}; ours vs torch max abs "
          f"{(g1.float() - g0.float()).abs().max().item():.3e}", flush=True)
    for name, fn in (("torch sdpa + cat", ref), ("packed cuDNN", ours), ("torch sdpa + cat", ref), ("packed cuDNN", ours)):
        print(f"micro: {name}: fwd+bwd {_bench(fn):.4f} ms", flush=True)
    from torch.profiler import ProfilerActivity, profile
    hg = (torch.randn(b * t, 4 * c, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
    bias = (torch.randn(4 * c, device="cuda") * 0.1).requires_grad_()
    dg = torch.randn(b * t, 4 * c, device="cuda").to(torch.bfloat16)
    def gref():
        with torch.autocast("cuda", torch.bfloat16):
            y = F.gelu(hg + bias.to(torch.bfloat16), approximate="tanh")
        return (y, *torch.autograd.grad(y, (hg, bias), dg))
    gref_c = torch.compile(gref)
    def gours():
        y = bias_gelu_op(hg, bias.to(torch.bfloat16))
        return (y, *torch.autograd.grad(y, (hg, bias), dg))
    r, o = gref_c(), gours()
    x64 = hg.detach().double() + bias.detach().to(torch.bfloat16).double()
    y64 = F.gelu(x64, approximate="tanh")
    print("micro gelu: y max abs vs compiled", (r[0].float() - o[0].float()).abs().max().item(),
          "y rel vs fp64 ref/ours", rel(r[0], y64), rel(o[0], y64),
          "dh max abs", (r[1].float() - o[1].float()).abs().max().item(),
          "db rel diff", ((r[2] - o[2]).norm() / r[2].norm()).item(), flush=True)
    print(f"micro gelu: compiled fwd+bwd {_bench(gref_c):.4f} ms, ours {_bench(gours):.4f} ms", flush=True)
    global BM_F, BN_F, BM_B, BN_B
    for cfg in ((32, 128, 64, 128), (16, 256, 32, 256), (64, 64, 128, 64), (32, 256, 64, 256), (8, 512, 16, 512)):
        BM_F, BN_F, BM_B, BN_B = cfg
        print(f"micro gelu: blocks {cfg}: ours {_bench(gours):.4f} ms", flush=True)
    BM_F, BN_F, BM_B, BN_B = 32, 128, 64, 128
    for name, fn in (("torch sdpa + cat", ref), ("packed cuDNN", ours), ("gelu compiled", gref_c), ("gelu ours", gours)):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
        tot = sum(e.device_time for e in ev) / 10 / 1e3
        top = {}
        for e in ev:
            top[e.name[:70]] = top.get(e.name[:70], 0) + e.device_time / 10 / 1e3
        print(f"micro: {name}: kernels {tot:.4f} ms an iteration: "
              + "; ".join(f"{k} {v:.4f}" for k, v in sorted(top.items(), key=lambda x: -x[1])[:6]), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["micro"]:
        micro()
    else:
        install(os.environ["EXP27"])
        sys.argv = ["turbotrain"] + sys.argv[1:]
        from turbotrain.cli import main
        raise SystemExit(main())

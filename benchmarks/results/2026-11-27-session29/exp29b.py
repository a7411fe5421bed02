"""Session 29 call 2: why the table AdamW kernel is slow. Variants of one kernel on GPT-2's 148 parameter shapes:
pointer table vs one flat buffer, IEEE div/sqrt vs approximate, full/tail split vs always masked, alignment hint.
Prints kernel time (CUDA events, median of 30), registers, spills, and whether the PTX has 16-byte vector loads."""
import statistics, itertools
import torch, triton, triton.language as tl

dev = torch.device("cuda")
from turbotrain.models.gpt import GPT
m = GPT(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)
sizes = [p.numel() for p in m.parameters()]; del m
N = sum(sizes)

@triton.jit
def k(ptrs, numels, blk_tensor, first_blk, n_tensors, flat_p, flat_g, flat_m, flat_v, n_flat, scale_ptr, decay, omb1, b2, omb2, ss, bc2, eps,
      TABLE: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr, HINT: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    if TABLE:
        t = tl.load(blk_tensor + b)
        start = (b - tl.load(first_blk + t)).to(tl.int64) * BLOCK
        n = tl.load(numels + t)
        a0 = tl.load(ptrs + t); a1 = tl.load(ptrs + n_tensors + t); a2 = tl.load(ptrs + 2 * n_tensors + t); a3 = tl.load(ptrs + 3 * n_tensors + t)
        if HINT:
            a0 = tl.multiple_of(a0, 16); a1 = tl.multiple_of(a1, 16); a2 = tl.multiple_of(a2, 16); a3 = tl.multiple_of(a3, 16)
        pp = a0.to(tl.pointer_type(tl.float32)); gp = a1.to(tl.pointer_type(tl.float32))
        mp = a2.to(tl.pointer_type(tl.float32)); vp = a3.to(tl.pointer_type(tl.float32))
    else:
        start = b.to(tl.int64) * BLOCK
        n = n_flat
        pp = flat_p; gp = flat_g; mp = flat_m; vp = flat_v
    offs = start + tl.arange(0, BLOCK)
    if SPLIT:
        full = start + BLOCK <= n
    else:
        full = False
    mask = offs < n
    if full:
        g = tl.load(gp + offs); p = tl.load(pp + offs); mm = tl.load(mp + offs); v = tl.load(vp + offs)
    else:
        g = tl.load(gp + offs, mask=mask); p = tl.load(pp + offs, mask=mask); mm = tl.load(mp + offs, mask=mask); v = tl.load(vp + offs, mask=mask)
    sc = tl.load(scale_ptr)
    if IEEE:
        g = tl.div_rn(g, sc)
    else:
        g = g / sc
    p = p * decay
    mm = mm + omb1 * (g - mm)
    v = v * b2 + omb2 * g * g
    if IEEE:
        p = p - ss * tl.div_rn(mm, tl.div_rn(tl.sqrt_rn(v), bc2) + eps)
    else:
        p = p - ss * (mm / (tl.sqrt(v) / bc2 + eps))
    if full:
        tl.store(pp + offs, p); tl.store(mp + offs, mm); tl.store(vp + offs, v)
    else:
        tl.store(pp + offs, p, mask=mask); tl.store(mp + offs, mm, mask=mask); tl.store(vp + offs, v, mask=mask)

flat = [torch.randn(N, device=dev) * s for s in (1, 0.01, 0.01, 0.0001)]
flat[3].abs_()
tensors = [[f[o:o + n].view(n) for o, n in zip(itertools.accumulate([0] + sizes[:-1]), sizes)] for f in flat]
# separate allocations, as the optimizer's are
sep = [[t.clone() for t in row] for row in tensors]
scale = torch.ones((), device=dev)

def timeit(fn, n=30):
    for _ in range(3): fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)

def tables(block):
    counts = [-(-n // block) for n in sizes]
    first = [sum(counts[:i]) for i in range(len(counts))]
    ptrs = torch.tensor([t.data_ptr() for row in sep for t in row], dtype=torch.int64, device=dev)
    return (ptrs, torch.tensor(sizes, dtype=torch.int64, device=dev),
            torch.tensor([i for i, c in enumerate(counts) for _ in range(c)], dtype=torch.int32, device=dev),
            torch.tensor(first, dtype=torch.int32, device=dev), len(sizes)), sum(counts)

ps = [p for p in sep[0]]
gs = sep[1]
fused = torch.optim.AdamW([torch.nn.Parameter(t.clone()) for t in sep[0]], lr=6e-4, betas=(0.9, 0.95), fused=True)
for p, g in zip(fused.param_groups[0]["params"], gs): p.grad = g.clone()
fused.step()
fused.grad_scale = scale
print(f"b fused torch: {timeit(lambda: fused.step()):.3f} ms; copy floor {N*28/4.27e12*1e3:.3f} ms")
for block, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8)):
    tab, nb = tables(block)
    for TABLE, IEEE, SPLIT, HINT in ((0, 1, 0, 0), (0, 0, 0, 0), (1, 1, 0, 0), (1, 1, 1, 0), (1, 1, 1, 1), (1, 0, 1, 1), (1, 0, 0, 0)):
        grid = (nb,) if TABLE else (triton.cdiv(N, block),)
        args = (*tab, *flat, N, scale, 0.9999, 0.1, 0.95, 0.05, 1e-3, 0.5, 1e-8)
        try:
            ck = k[grid](*args, TABLE=TABLE, IEEE=IEEE, SPLIT=SPLIT, HINT=HINT, BLOCK=block, num_warps=warps)
            ms = timeit(lambda: k[grid](*args, TABLE=TABLE, IEEE=IEEE, SPLIT=SPLIT, HINT=HINT, BLOCK=block, num_warps=warps))
            ptx = ck.asm["ptx"]
            print(f"b block {block} warps {warps} table {TABLE} ieee {IEEE} split {SPLIT} hint {HINT}: {ms:.3f} ms, regs {ck.n_regs} spills {ck.n_spills}, v4 loads {ptx.count('ld.global.v4')} scalar loads {ptx.count('ld.global.b32') + ptx.count('ld.global.f32')} v4 stores {ptx.count('st.global.v4')}")
        except Exception as e:
            print(f"b block {block} table {TABLE} ieee {IEEE} split {SPLIT} hint {HINT}: error {type(e).__name__}: {str(e)[:300]}")

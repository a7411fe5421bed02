"""The fused loss's per-row kernel (online logsumexp, loss, softmax - onehot written over the logits), swept over
block size, warps and L2 eviction hints, for the GPT-2 (16384 x 50304) and Llama-1B (8192 x 128256) logits in bf16.
Reference: a clone of the logits (read + write of the same bytes: the floor this kernel can reach)."""
import statistics, torch, triton, triton.language as tl

@triton.jit
def ce_rows(logits_ptr, stride, target_ptr, loss_ptr, n_cols, ignore_index, BLOCK: tl.constexpr, HINT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ptr = logits_ptr + row * stride
    y = tl.load(target_ptr + row)
    valid = y != ignore_index
    y = tl.where(valid, y, 0)
    m = float("-inf")
    s = 0.0
    for off in range(0, n_cols, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        if HINT:
            x = tl.load(ptr + cols, mask=cols < n_cols, other=float("-inf"), eviction_policy="evict_last").to(tl.float32)
        else:
            x = tl.load(ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    lse = m + tl.log(s)
    picked = tl.load(ptr + y).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
    scale = tl.where(valid, 1.0, 0.0)
    for off in range(0, n_cols, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        mask = cols < n_cols
        if HINT:
            x = tl.load(ptr + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(ptr + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.exp(x - lse)
        g = tl.where(cols == y, g - 1.0, g) * scale
        tl.store(ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)

def t(fn, reps=7, n=10):
    fn(); torch.cuda.synchronize(); out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n): fn()
        b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b) / n)
    return statistics.median(out)

for N, V in ((16384, 50304), (8192, 128256)):
    torch.manual_seed(0)
    base = torch.randn(N, V, device="cuda", dtype=torch.bfloat16) * 3
    y = torch.randint(0, V, (N,), device="cuda"); loss = torch.empty(N, device="cuda")
    gb = 2 * base.numel() * 2 / 1e9
    logits = base.clone()
    ref = t(lambda: logits.copy_(base))
    print(f"\n## {N} x {V} bf16: copy (read + write {gb:.2f} GB) {ref:.3f} ms = {gb/ref:.2f} TB/s", flush=True)
    # correctness of one configuration against torch
    lg = base.clone(); ce_rows[(N,)](lg, lg.stride(0), y, loss, V, -100, BLOCK=4096, HINT=True, num_warps=8)
    x = base.float(); lse = torch.logsumexp(x, 1); want = lse - x.gather(1, y[:, None]).squeeze(1)
    g = torch.softmax(x, 1); g[torch.arange(N, device="cuda"), y] -= 1
    print(f"check: loss max err {(loss - want).abs().max().item():.2e}, grad max err {(lg.float() - g).abs().max().item():.2e}")
    rows = []
    for block in (2048, 4096, 8192, 16384, 32768):
        for warps in (4, 8, 16, 32):
            if block // (32 * warps) < 1:
                continue
            for hint in (False, True):
                try:
                    ms = t(lambda: ce_rows[(N,)](logits, logits.stride(0), y, loss, V, -100, BLOCK=block, HINT=hint, num_warps=warps))
                except Exception as e:
                    print(f"  BLOCK {block} warps {warps} hint {hint}: {type(e).__name__}"); continue
                rows.append((ms, block, warps, hint))
    rows.sort()
    for ms, block, warps, hint in rows[:8] + [r for r in rows if r[1:] == (32768, 32, False)]:
        print(f"  {ms:.3f} ms ({gb/ms:.2f} TB/s, {ms/ref:.2f}x copy)  BLOCK {block:5d} warps {warps:2d} evict hints {hint}", flush=True)

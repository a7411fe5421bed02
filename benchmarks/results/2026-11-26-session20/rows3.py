"""The fused loss's row kernel, one pass: the whole row (vocab <= BLOCK) held in registers (bf16 in, fp32 math), read
once and written once, vs as shipped (two passes). GPT-2's 16384 x 50304 bf16 logits; a copy of the bytes is the floor."""
import statistics, torch, triton, triton.language as tl
from turbotrain.accel.fused_loss import _triton_rows

@triton.jit
def ce_row1(logits_ptr, stride, target_ptr, loss_ptr, n_cols, ignore_index, BLOCK: tl.constexpr, UP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ptr = logits_ptr + row * stride
    y = tl.load(target_ptr + row)
    valid = y != ignore_index
    y = tl.where(valid, y, 0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(ptr + cols, mask=mask, other=float("-inf"))
    if UP:
        x = x.to(tl.float32)
    m = tl.max(x, 0).to(tl.float32)
    e = tl.exp(x.to(tl.float32) - m)
    s = tl.sum(e, 0)
    lse = m + tl.log(s)
    picked = tl.sum(tl.where(cols == y, x.to(tl.float32), 0.0), 0)
    tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
    g = e / s
    g = tl.where(cols == y, g - 1.0, g) * tl.where(valid, 1.0, 0.0)
    tl.store(ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)

def t(fn, reps=7, n=10):
    fn(); torch.cuda.synchronize(); out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n): fn()
        b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b) / n)
    return statistics.median(out)

shipped = _triton_rows()
for N, V in ((16384, 50304), (16384, 32768)):
    torch.manual_seed(0)
    base = torch.randn(N, V, device="cuda", dtype=torch.bfloat16) * 3
    y = torch.randint(0, V, (N,), device="cuda"); y[::7] = -100; loss = torch.empty(N, device="cuda")
    gb = 2 * base.numel() * 2 / 1e9
    logits = base.clone()
    ref = t(lambda: logits.copy_(base))
    print(f"\n## {N} x {V} bf16: copy {ref:.3f} ms = {gb/ref:.2f} TB/s", flush=True)
    lg = base.clone(); l1 = torch.empty(N, device="cuda"); shipped(lg, y, l1, -100)
    ms = t(lambda: shipped(logits, y, loss, -100))
    print(f"  {ms:.3f} ms ({ms/ref:.2f}x copy)  shipped", flush=True)
    block = triton.next_power_of_2(V)
    for warps in (16, 32):
        for up in (False, True):
            try:
                lg2 = base.clone(); l2 = torch.empty(N, device="cuda")
                ce_row1[(N,)](lg2, lg2.stride(0), y, l2, V, -100, BLOCK=block, UP=up, num_warps=warps)
                err_l = (l2 - l1).abs().max().item(); err_g = (lg2.float() - lg.float()).abs().max().item()
                ms = t(lambda: ce_row1[(N,)](logits, logits.stride(0), y, loss, V, -100, BLOCK=block, UP=up, num_warps=warps))
                print(f"  {ms:.3f} ms ({ms/ref:.2f}x copy)  one pass BLOCK {block} warps {warps} upcast-first {up}; "
                      f"vs shipped: loss {err_l:.1e}, grad {err_g:.1e}", flush=True)
            except Exception as e:
                print(f"  warps {warps} up {up}: {type(e).__name__}: {str(e)[:200]}", flush=True)

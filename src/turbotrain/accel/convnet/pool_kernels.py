"""The Triton kernels of `max_pool.py` and `bn_relu_pool.py` (imported only where triton is installed): 2-D max
pooling over NHWC memory, alone or after batch norm + ReLU, each program a block of [pixels × channels] so every
load is a contiguous run of channels. The fused layer's forward is three passes (statistics, their combination,
normalise-and-pool), its backward two (the two channel sums over the pooled outputs, then the input gradient).
"""
import torch
import triton
import triton.language as tl

ROWS = 2048  # pixels summed by one program of a statistics pass (its partial sums are [pixels / ROWS, C])


@triton.jit
def _tile(P, C, H, W, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's block: pixels (flattened n, row, column of an [N, H, W] grid) × channels, with masks."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    pmask, cmask = pix < P, ch < C
    dst = pix.to(tl.int64)[:, None] * C + ch[None, :]
    return pix, ch, pmask, cmask, dst, pix // (W * H), (pix // W) % H, pix % W


@triton.jit
def _bn_relu(x, mean, rstd, w, b, DTYPE: tl.constexpr):
    """relu(batch_norm(x)) rounded to the activation dtype, as the unfused layers store it; NaN passes (torch's
    relu keeps it)."""
    y = (x - mean[None, :]) * rstd[None, :] * w[None, :] + b[None, :]
    return tl.where(y <= 0, 0.0, y).to(DTYPE).to(tl.float32)


@triton.jit
def _channel_params(mean_ptr, var_ptr, w_ptr, b_ptr, ch, cmask, eps):
    mean = tl.load(mean_ptr + ch, mask=cmask, other=0.0)
    rstd = 1.0 / tl.sqrt(tl.load(var_ptr + ch, mask=cmask, other=1.0) + eps)
    w = tl.load(w_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
    return mean, rstd, w, b


@triton.jit
def pool_fwd(x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, out_ptr, off_ptr, xmax_ptr, eps, P, C, H, W, OH, OW,
             NORM: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
             PH: tl.constexpr, PW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Each window's maximum (PyTorch's rules: the first maximum in row-major order wins, a NaN wins over any
    number) and its int8 argmax offset; with NORM, of relu(batch_norm(x)), also storing the input value at the
    argmax (what the backward's channel sums need, without a gather)."""
    pix, ch, pmask, cmask, dst, n, oh, ow = _tile(P, C, OH, OW, BLOCK_P, BLOCK_C)  # output pixels
    if NORM:
        mean, rstd, w, b = _channel_params(mean_ptr, var_ptr, w_ptr, b_ptr, ch, cmask, eps)
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    # PyTorch starts from the window's first in-bounds position with -inf
    first = (tl.maximum(h0, 0) - h0) * KW + (tl.maximum(w0, 0) - w0)
    best = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    xbest = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    arg = tl.broadcast_to(first[:, None], (BLOCK_P, BLOCK_C)).to(tl.int32)
    for kh in tl.static_range(KH):
        ih = h0 + kh
        for kw in tl.static_range(KW):
            iw = w0 + kw
            ok = pmask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            row = ((n * H + ih) * W + iw).to(tl.int64) * C
            v = tl.load(x_ptr + row[:, None] + ch[None, :], mask=ok[:, None] & cmask[None, :],
                        other=float("-inf")).to(tl.float32)
            y = v
            if NORM:
                y = _bn_relu(v, mean, rstd, w, b, out_ptr.dtype.element_ty)
            take = ((y > best) | (y != y)) & ok[:, None]
            best = tl.where(take, y, best)
            if NORM:
                xbest = tl.where(take, v, xbest)
            arg = tl.where(take, kh * KW + kw, arg)
    mask2 = pmask[:, None] & cmask[None, :]
    tl.store(out_ptr + dst, best.to(out_ptr.dtype.element_ty), mask=mask2)
    tl.store(off_ptr + dst, arg.to(tl.int8), mask=mask2)
    if NORM:
        tl.store(xmax_ptr + dst, xbest.to(xmax_ptr.dtype.element_ty), mask=mask2)


@triton.jit
def _routed(g_ptr, off_ptr, n, ih, iw, ch, pmask, cmask, C, OH, OW, KH: tl.constexpr, KW: tl.constexpr,
            SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, TH: tl.constexpr,
            TW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Σ, in fp32, of the gradients of the windows whose argmax is input pixel (ih, iw): the windows that may hold
    it, in PyTorch's summation order (oh, then ow, ascending)."""
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for th in tl.static_range(TH):
        oh = (ih + PH) // SH - (TH - 1 - th)
        dh = ih + PH - oh * SH
        okh = (oh >= 0) & (oh < OH) & (dh < KH)
        for tw in tl.static_range(TW):
            ow = (iw + PW) // SW - (TW - 1 - tw)
            dw = iw + PW - ow * SW
            ok = pmask & okh & (ow >= 0) & (ow < OW) & (dw < KW)
            src = ((n * OH + oh) * OW + ow).to(tl.int64)[:, None] * C + ch[None, :]
            m = ok[:, None] & cmask[None, :]
            off = tl.load(off_ptr + src, mask=m, other=-1).to(tl.int32)
            acc += tl.load(g_ptr + src, mask=m & (off == (dh * KW + dw)[:, None]), other=0.0).to(tl.float32)
    return acc


@triton.jit
def pool_bwd(g_ptr, off_ptr, gin_ptr, P, C, H, W, OH, OW,
             KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
             PH: tl.constexpr, PW: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr,
             BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pix, ch, pmask, cmask, dst, n, ih, iw = _tile(P, C, H, W, BLOCK_P, BLOCK_C)  # input pixels
    acc = _routed(g_ptr, off_ptr, n, ih, iw, ch, pmask, cmask, C, OH, OW, KH, KW, SH, SW, PH, PW, TH, TW,
                  BLOCK_P, BLOCK_C)
    tl.store(gin_ptr + dst, acc.to(gin_ptr.dtype.element_ty), mask=pmask[:, None] & cmask[None, :])


@triton.jit
def stats_partial(x_ptr, P, C, mean_ptr, m2_ptr, ROWS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Mean and sum of squared deviations of each channel over this program's ROWS pixels: Welford's update per
    lane of a [BLOCK_P × BLOCK_C] block (no E[x²] − E[x]² cancellation), the lanes merged once at the end."""
    g = tl.program_id(0)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    count = tl.zeros((BLOCK_P, 1), tl.float32)
    mean = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    m2 = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for i in range(0, ROWS, BLOCK_P):
        pix = g * ROWS + i + tl.arange(0, BLOCK_P)
        pmask = (pix < P)[:, None]
        v = tl.load(x_ptr + pix.to(tl.int64)[:, None] * C + ch[None, :], mask=pmask & cmask[None, :],
                    other=0.0).to(tl.float32)
        count += pmask.to(tl.float32)
        delta = tl.where(pmask, v - mean, 0.0)
        mean += delta / tl.maximum(count, 1.0)
        m2 += delta * (v - mean)
    n = tl.sum(count, axis=0)
    gmean = tl.sum(mean * count, axis=0) / tl.maximum(n, 1.0)
    d = mean - gmean[None, :]
    tl.store(mean_ptr + g * C + ch, gmean, mask=cmask)
    tl.store(m2_ptr + g * C + ch, tl.sum(m2 + count * d * d, axis=0), mask=cmask)


@triton.jit
def stats_combine(pmean_ptr, pm2_ptr, mean_ptr, var_ptr, P, C, G, ROWS: tl.constexpr, BLOCK_G: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    """The G partials of `stats_partial` merged: the batch mean (their count-weighted mean), then the biased
    variance (their squared deviations plus each partial's count × its mean's squared distance to the batch's)."""
    ch = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    total = tl.zeros((BLOCK_C,), tl.float32)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        n = tl.minimum(P - g * ROWS, ROWS).to(tl.float32)
        m = (g < G)[:, None] & cmask[None, :]
        gmean = tl.load(pmean_ptr + g[:, None] * C + ch[None, :], mask=m, other=0.0)
        total += tl.sum(tl.where(m, gmean * n[:, None], 0.0), axis=0)
    mean = total / P
    m2 = tl.zeros((BLOCK_C,), tl.float32)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        n = tl.minimum(P - g * ROWS, ROWS).to(tl.float32)
        m = (g < G)[:, None] & cmask[None, :]
        d = tl.load(pmean_ptr + g[:, None] * C + ch[None, :], mask=m, other=0.0) - mean[None, :]
        gm2 = tl.load(pm2_ptr + g[:, None] * C + ch[None, :], mask=m, other=0.0)
        m2 += tl.sum(tl.where(m, gm2 + n[:, None] * d * d, 0.0), axis=0)
    tl.store(mean_ptr + ch, mean, mask=cmask)
    tl.store(var_ptr + ch, m2 / P, mask=cmask)


@triton.jit
def grad_sums_partial(g_ptr, xmax_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, eps, P, C, s1_ptr, s2_ptr,
                      ROWS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per channel, over this program's ROWS output pixels: Σ dy and Σ dy·x̂, where dy is the gradient at the
    batch norm's output. Each output's gradient reaches exactly its window's argmax, where relu passed it if the
    pooled value is positive, so both sums are over the pooled outputs."""
    g = tl.program_id(0)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = ch < C
    mean, rstd, w, b = _channel_params(mean_ptr, var_ptr, w_ptr, b_ptr, ch, cmask, eps)
    s1 = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    s2 = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for i in range(0, ROWS, BLOCK_P):
        pix = g * ROWS + i + tl.arange(0, BLOCK_P)
        m = (pix < P)[:, None] & cmask[None, :]
        src = pix.to(tl.int64)[:, None] * C + ch[None, :]
        x = tl.load(xmax_ptr + src, mask=m, other=0.0).to(tl.float32)
        y = _bn_relu(x, mean, rstd, w, b, xmax_ptr.dtype.element_ty)
        dy = tl.where(m & ~(y <= 0), tl.load(g_ptr + src, mask=m, other=0.0).to(tl.float32), 0.0)
        s1 += dy
        s2 += dy * ((x - mean[None, :]) * rstd[None, :])
    tl.store(s1_ptr + g * C + ch, tl.sum(s1, axis=0), mask=cmask)
    tl.store(s2_ptr + g * C + ch, tl.sum(s2, axis=0), mask=cmask)


@triton.jit
def grad_input(g_ptr, off_ptr, x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, s1_ptr, s2_ptr, dx_ptr, eps, count,
               P, C, H, W, OH, OW, BATCH_STATS: tl.constexpr,
               KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
               PH: tl.constexpr, PW: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr,
               BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """dx of batch norm (with BATCH_STATS, the batch statistics' own gradient terms) from dy = the pooled
    outputs' gradient routed to their argmax (max pool's backward), masked by relu."""
    pix, ch, pmask, cmask, dst, n, ih, iw = _tile(P, C, H, W, BLOCK_P, BLOCK_C)  # input pixels
    mean, rstd, w, b = _channel_params(mean_ptr, var_ptr, w_ptr, b_ptr, ch, cmask, eps)
    acc = _routed(g_ptr, off_ptr, n, ih, iw, ch, pmask, cmask, C, OH, OW, KH, KW, SH, SW, PH, PW, TH, TW,
                  BLOCK_P, BLOCK_C)
    mask2 = pmask[:, None] & cmask[None, :]
    x = tl.load(x_ptr + dst, mask=mask2, other=0.0).to(tl.float32)
    y = _bn_relu(x, mean, rstd, w, b, dx_ptr.dtype.element_ty)
    dy = tl.where(y <= 0, 0.0, acc)
    scale = (w * rstd)[None, :]
    if BATCH_STATS:
        s1 = tl.load(s1_ptr + ch, mask=cmask, other=0.0)
        s2 = tl.load(s2_ptr + ch, mask=cmask, other=0.0)
        xhat = (x - mean[None, :]) * rstd[None, :]
        dx = scale * (dy - (s1 / count)[None, :] - xhat * (s2 / count)[None, :])
    else:
        dx = scale * dy
    tl.store(dx_ptr + dst, dx.to(dx_ptr.dtype.element_ty), mask=mask2)


# Launch shape per kernel: (elements of a [pixels × channels] block, most channels in a block, warps); the fused
# layer's are the fastest of a sweep at ResNet-50's stem on an H100 (docs/benchmarks.md, session 18 call A2).
TILES = {"pool_fwd": (4096, 128, 4), "pool_bwd": (4096, 128, 4),
         "stats": (1024, 64, 4), "apply": (1024, 64, 4), "sums": (2048, 64, 4), "grad": (4096, 64, 4)}


def _launch(kernel, tile: str, pixels: int, c: int, *args, rows: int = 0, **constexprs) -> None:
    """`kernel` over `pixels` × c in TILES[tile] blocks; with `rows`, each program walks `rows` pixels."""
    elements, most, warps = TILES[tile]
    block_c = min(most, triton.next_power_of_2(c))
    block_p = max(1, elements // block_c)
    if rows:
        block_p = min(block_p, rows)  # both powers of two: a program's rows are whole blocks
        constexprs["ROWS"] = rows
    grid = (triton.cdiv(pixels, rows or block_p), triton.cdiv(c, block_c))
    kernel[grid](*args, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=warps, **constexprs)


def _channel_sums(kernel, tile: str, pixels: int, c: int, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a `*_partial` kernel over `pixels` × c; its two [pixels / ROWS, c] fp32 partials."""
    a, b = (torch.empty((triton.cdiv(pixels, ROWS), c), dtype=torch.float32, device=args[0].device)
            for _ in range(2))
    _launch(kernel, tile, pixels, c, *args, pixels, c, a, b, rows=ROWS)
    return a, b


def batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, biased variance) per channel of a channels_last x, in fp32."""
    n, c, h, w = x.shape
    pmean, pm2 = _channel_sums(stats_partial, "stats", n * h * w, c, x)
    mean, var = (torch.empty(c, dtype=torch.float32, device=x.device) for _ in range(2))
    block_c = min(64, triton.next_power_of_2(c))
    stats_combine[(triton.cdiv(c, block_c),)](pmean, pm2, mean, var, n * h * w, c, pmean.shape[0],
                                              ROWS=ROWS, BLOCK_G=64, BLOCK_C=block_c)
    return mean, var


def _windows(kernel, stride) -> list[int]:
    """The most windows holding one element, per axis."""
    return [-(-k // s) for k, s in zip(kernel, stride)]


def max_pool_forward(x, out, offsets, kernel, stride, padding) -> None:
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    _launch(pool_fwd, "pool_fwd", n * oh * ow, c, x, x, x, x, x, out, offsets, x, 0.0, n * oh * ow, c, h, w, oh,
            ow, False, *kernel, *stride, *padding)


def max_pool_backward(grad, offsets, gin, kernel, stride, padding) -> None:
    n, c, h, w = gin.shape
    oh, ow = grad.shape[2:]
    _launch(pool_bwd, "pool_bwd", n * h * w, c, grad, offsets, gin, n * h * w, c, h, w, oh, ow, *kernel, *stride,
            *padding, *_windows(kernel, stride))


def bn_relu_pool_forward(x, mean, var, weight, bias, eps, out, offsets, xmax, kernel, stride, padding) -> None:
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    _launch(pool_fwd, "apply", n * oh * ow, c, x, mean, var, weight, bias, out, offsets, xmax, eps, n * oh * ow,
            c, h, w, oh, ow, True, *kernel, *stride, *padding)


def bn_relu_pool_backward(grad, offsets, x, xmax, mean, var, weight, bias, eps, from_batch, dx, kernel, stride,
                          padding):
    """dx into `dx`; returns (Σ dy·x̂, Σ dy) per channel: the weight's and the bias's gradients in fp32."""
    n, c, h, w = x.shape
    oh, ow = grad.shape[2:]
    s1, s2 = (t.sum(0) for t in _channel_sums(grad_sums_partial, "sums", n * oh * ow, c, grad, xmax, mean, var,
                                                weight, bias, eps))
    _launch(grad_input, "grad", n * h * w, c, grad, offsets, x, mean, var, weight, bias, s1, s2, dx, eps,
            float(n * h * w), n * h * w, c, h, w, oh, ow, from_batch, *kernel, *stride, *padding,
            *_windows(kernel, stride))
    return s2, s1

"""The Triton kernels of `max_pool.py` (imported only where triton is installed): forward and backward of 2-D max
pooling over NHWC memory, each program a block of [pixels × channels] so every load is a contiguous run of channels.
"""
import triton
import triton.language as tl


@triton.jit
def _tile(P, C, H, W, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's block: pixels (flattened n, row, column of an [N, H, W] grid) × channels, with masks."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    pmask, cmask = pix < P, ch < C
    dst = pix.to(tl.int64)[:, None] * C + ch[None, :]
    return pix, ch, pmask, cmask, dst, pix // (W * H), (pix // W) % H, pix % W


@triton.jit
def pool_fwd(x_ptr, out_ptr, off_ptr, P, C, H, W, OH, OW,
             KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
             PH: tl.constexpr, PW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pix, ch, pmask, cmask, dst, n, oh, ow = _tile(P, C, OH, OW, BLOCK_P, BLOCK_C)  # output pixels
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    # PyTorch starts from the window's first in-bounds position with -inf
    first = (tl.maximum(h0, 0) - h0) * KW + (tl.maximum(w0, 0) - w0)
    best = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    arg = tl.broadcast_to(first[:, None], (BLOCK_P, BLOCK_C)).to(tl.int32)
    for kh in tl.static_range(KH):
        ih = h0 + kh
        for kw in tl.static_range(KW):
            iw = w0 + kw
            ok = pmask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            row = ((n * H + ih) * W + iw).to(tl.int64) * C
            v = tl.load(x_ptr + row[:, None] + ch[None, :], mask=ok[:, None] & cmask[None, :],
                        other=float("-inf")).to(tl.float32)
            take = ((v > best) | (v != v)) & ok[:, None]
            best = tl.where(take, v, best)
            arg = tl.where(take, kh * KW + kw, arg)
    mask2 = pmask[:, None] & cmask[None, :]
    tl.store(out_ptr + dst, best.to(out_ptr.dtype.element_ty), mask=mask2)
    tl.store(off_ptr + dst, arg.to(tl.int8), mask=mask2)


@triton.jit
def pool_bwd(g_ptr, off_ptr, gin_ptr, P, C, H, W, OH, OW,
             KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
             PH: tl.constexpr, PW: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr,
             BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pix, ch, pmask, cmask, dst, n, ih, iw = _tile(P, C, H, W, BLOCK_P, BLOCK_C)  # input pixels
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    # the windows that may hold (ih, iw), in PyTorch's summation order (oh, then ow, ascending)
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
            g = tl.load(g_ptr + src, mask=m & (off == (dh * KW + dw)[:, None]), other=0.0)
            acc += g.to(tl.float32)
    tl.store(gin_ptr + dst, acc.to(gin_ptr.dtype.element_ty), mask=pmask[:, None] & cmask[None, :])


def _launch(kernel, pixels, c: int, *args) -> None:
    """`kernel` over `pixels` × c in blocks of [4096 / block_c pixels × block_c ≤ 128 channels]."""
    block_c = min(128, triton.next_power_of_2(c))
    block_p = max(1, 4096 // block_c)
    kernel[(triton.cdiv(pixels, block_p), triton.cdiv(c, block_c))](*args, BLOCK_P=block_p, BLOCK_C=block_c)


def forward(x, out, offsets, kernel, stride, padding):
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    _launch(pool_fwd, n * oh * ow, c, x, out, offsets, n * oh * ow, c, h, w, oh, ow, *kernel, *stride, *padding)


def backward(grad, offsets, gin, kernel, stride, padding):
    n, c, h, w = gin.shape
    oh, ow = grad.shape[2:]
    windows = [-(-k // s) for k, s in zip(kernel, stride)]  # the most windows holding one element, per axis
    _launch(pool_bwd, n * h * w, c, grad, offsets, gin, n * h * w, c, h, w, oh, ow, *kernel, *stride, *padding,
            *windows)

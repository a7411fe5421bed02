"""Fused LM head + cross-entropy (`kernels.fused_loss`): `F.cross_entropy(h @ W.T, y)` with no fp32
logits, no second [tokens × vocab] buffer for their gradient, and the logits in chunks of tokens above 2 GiB.

Why this design. The head's matmul is the big cost and cuBLAS does it best, so it stays cuBLAS; what the
fusion removes is memory traffic and footprint: the unfused path writes the full logits, reads them back
in fp32 for the softmax, and keeps them (or their fp32 softmax) for backward — at 16k tokens × 128k vocab
that is 4-8 GB. Here the tokens go in chunks (one while the logits fit CHUNK_LOGITS_BYTES); per chunk:
  1. logits = h_c @ W^T (cuBLASLt, its fastest algorithm for the shape, timed once; in the autocast dtype: bf16
     where training runs bf16);
  2. per row, a Triton kernel on GPU: logsumexp by online softmax in fp32 and the row's loss (pass 1), then
     d(logits) = softmax − onehot written over the logits in place (pass 2, the row read again from L2);
  3. grad_h_c = dlogits @ W and grad_W += dlogits^T @ h_c (fp32 accumulator over chunks).
Forward thus computes the gradients too, and backward only scales them by grad_output / N (one scalar
multiply it does anyway): the loss is the last op of a step, so the gradients are always wanted and
computing them while the chunk's logits are hot costs nothing extra. The 1/N is left to that multiply
rather than folded into d(logits) because in fp16 (softmax − onehot)/N underflows for small probabilities
at N ~ 10⁴ tokens; unscaled, the values lie in [-1, 1]. Peak memory: one chunk of logits, grad_W in fp32.

The loss is the mean over tokens whose target is not `ignore_index` (-100), as `F.cross_entropy`. The
op is a `torch.library.custom_op` (opaque to dynamo, with a fake implementation for shapes) whose autograd
formula is registered on the op itself, so `torch.compile(fullgraph=True)` over model + loss traces through
it and the graph holds nothing but ops: AOT-autograd's cache keeps such a graph (a Python autograd.Function
in it makes that cache bypass, and a warm start then re-traces forward and backward).

Reference path (CPU, or GPU without triton): the same chunked algorithm in plain torch with an fp32
softmax; in fp32 it equals `F.cross_entropy(h @ W.T, y)` to rounding.
"""
from __future__ import annotations

import functools

import torch

from turbotrain.models import cublaslt

IGNORE_INDEX = -100
SETTING = "kernels.fused_loss"
# One chunk's logits. Each extra chunk costs time (its GEMMs accumulate into grad_W and split K): at Llama-1B's head,
# 8 chunks of 256 MiB took 23.7 ms a step where one took 21.7 (benchmarks/NOTES.md, session 14). 2 GiB keeps GPT-2's
# and Llama-1B's micro-batches in one chunk, whose peak is near what the compiled unfused loss holds anyway.
CHUNK_LOGITS_BYTES = 2 << 30


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               ignore_index: int = IGNORE_INDEX, chunk_tokens: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` (logits) against integer `target`, never building the logits
    of all tokens. hidden: (..., D), weight: (V, D) (an nn.Linear's weight, no bias), target: (...).
    Under autocast the matmuls run in the autocast dtype, the softmax in fp32.
    Usage: `loss = fused_linear_cross_entropy(model.hidden(x), model.head.weight, y)`."""
    h = hidden.reshape(-1, hidden.shape[-1])
    dev = h.device.type
    # The op is opaque to autocast, so the compute dtype is decided here, where autocast's state is visible.
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    # cast here, not in the op: the compiler writes h in the compute dtype from the kernel that makes it (a final
    # norm's), and casts the gradient back inside the kernel that reads it, instead of two copies of their own
    h = h.to(dtype)
    if chunk_tokens is None:
        per_token = weight.shape[0] * torch.finfo(dtype).bits // 8
        chunk_tokens = max(128, CHUNK_LOGITS_BYTES // per_token // 128 * 128)
    return torch.ops.turbotrain.fused_linear_ce(h, weight, target.reshape(-1), ignore_index, chunk_tokens, dtype)[0]


@torch.library.custom_op("turbotrain::fused_linear_ce", mutates_args=())
def _fused_linear_ce(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
                     chunk_tokens: int, dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss fp32, N · d loss/d h, N · d loss/d weight, 1/N) of cross-entropy over h @ weight.T, in chunks
    of tokens; N = the number of targets not ignored."""
    with torch.autocast(h.device.type, enabled=False):  # the dtypes are chosen explicitly by the caller
        return _chunked_linear_ce(h, weight, target, ignore_index, chunk_tokens, dtype)


@_fused_linear_ce.register_fake
def _(h, weight, target, ignore_index, chunk_tokens, dtype):
    scalar = h.new_empty((), dtype=torch.float32)
    return scalar, torch.empty_like(h), torch.empty_like(weight), torch.empty_like(scalar)


def _setup_context(ctx, inputs, output) -> None:
    _, grad_h, grad_w, inv_n = output
    ctx.save_for_backward(grad_h, grad_w, inv_n)


def _backward(ctx, grad_loss, *_unused):
    """Only the loss is differentiated (the other outputs are forward's by-products): the gradients forward
    computed, scaled by grad_output / N."""
    grad_h, grad_w, inv_n = ctx.saved_tensors
    scale = grad_loss.float() * inv_n  # fp32: grad_output (the loss scale under fp16) times 1/N
    # scaled in fp32, then rounded once to the input's dtype (the gradient of a bf16 h is bf16)
    return (grad_h.float() * scale).to(grad_h.dtype), (grad_w.float() * scale).to(grad_w.dtype), None, None, None, None


_fused_linear_ce.register_autograd(_backward, setup_context=_setup_context)


def _chunked_linear_ce(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
                       chunk_tokens: int, dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n_tok = h.shape[0]
    # The Triton kernel reads the target's logit unchecked: a target outside [0, V) would read another row's
    # memory and give a wrong loss silently. Checked on the device (no host sync), as F.cross_entropy does.
    torch._assert_async(((target >= 0) & (target < weight.shape[0]) | (target == ignore_index)).all(),
                        "kernels.fused_loss: a target is outside [0, vocab_size) and not the ignore_index")
    hc_all, w = h.to(dtype), weight.to(dtype)
    inv_n = 1.0 / (target != ignore_index).sum().to(torch.float32)  # stays on the device: no host sync
    row_loss = torch.empty(n_tok, dtype=torch.float32, device=h.device)
    grad_h = torch.empty(n_tok, h.shape[1], dtype=dtype, device=h.device)
    # the first chunk's product overwrites grad_w (beta 0), later ones add to it: no pass of zeros over [V, D]
    grad_w = (torch.empty if n_tok else torch.zeros)(weight.shape, dtype=torch.float32, device=h.device)
    rows = _triton_rows() if h.is_cuda else None
    for start in range(0, n_tok, chunk_tokens):
        end = min(start + chunk_tokens, n_tok)
        hc = hc_all[start:end]
        logits = _head(hc, w)  # (chunk, V) in the compute dtype; becomes d(logits) in place below
        if rows is not None:
            rows(logits, target[start:end], row_loss[start:end], ignore_index)
        else:
            _reference_rows(logits, target[start:end], row_loss[start:end], ignore_index)
        torch.mm(logits, w, out=grad_h[start:end])
        _accumulate_grad_w(grad_w, logits, hc, first=start == 0)
    loss = row_loss.sum() * inv_n
    return loss, grad_h.to(h.dtype), grad_w.to(weight.dtype), inv_n


def _head(hc: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """hc @ w^T; on a GPU by cuBLASLt's fastest algorithm for the shape (models/cublaslt.py), which for a head's
    shapes is often not cuBLAS's first choice."""
    if hc.is_cuda and _cublaslt_ok():
        logits = hc.new_empty(hc.shape[0], w.shape[0])
        if not cublaslt.matmul(logits, hc, w, a_t=False, b_t=True, accumulate=False, setting=SETTING):
            torch.mm(hc, w.t(), out=logits)  # a shape cuBLASLt does not take: torch's, in the same buffer
        return logits
    return hc @ w.t()


@functools.cache
def _cublaslt_ok() -> bool:
    return cublaslt.problem() is None


def _accumulate_grad_w(grad_w: torch.Tensor, dlogits: torch.Tensor, hc: torch.Tensor, first: bool) -> None:
    """grad_w += dlogits^T @ hc (`first`: grad_w = ..., whatever grad_w held); on CUDA straight into the fp32
    accumulator (cuBLASLt's fastest algorithm, else torch's `out_dtype`), with no [V, D] temporary in bf16 and
    again in fp32 per chunk."""
    if grad_w.is_cuda and _cublaslt_ok() and cublaslt.matmul(grad_w, dlogits, hc, a_t=True, b_t=False,
                                                             accumulate=not first, setting=SETTING):
        return
    beta = 0 if first else 1  # beta 0: the GEMM never reads grad_w (uninitialised memory, NaN included)
    if grad_w.dtype == dlogits.dtype:
        grad_w.addmm_(dlogits.t(), hc, beta=beta)
    elif _mixed_addmm(grad_w.device, dlogits.dtype, grad_w.dtype):
        torch.addmm(grad_w, dlogits.t(), hc, beta=beta, out_dtype=grad_w.dtype, out=grad_w)
    elif first:
        grad_w.copy_(dlogits.t() @ hc)
    else:
        grad_w += (dlogits.t() @ hc).to(grad_w.dtype)


@functools.cache
def _mixed_addmm(device: torch.device, dtype: torch.dtype, out_dtype: torch.dtype) -> bool:
    """Whether this torch and device add a low-precision product into a wider tensor (addmm's `out_dtype`:
    CUDA, bf16/fp16 into fp32, recent torch)."""
    if device.type != "cuda":
        return False
    acc, a = torch.ones(2, 2, dtype=out_dtype, device=device), torch.ones(2, 2, dtype=dtype, device=device)
    fresh = torch.full((2, 2), float("nan"), dtype=out_dtype, device=device)
    try:
        torch.addmm(acc, a, a, out_dtype=out_dtype, out=acc)
        torch.addmm(fresh, a, a, beta=0, out_dtype=out_dtype, out=fresh)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    # accumulated (1 + 2), not overwritten; beta 0 overwrites (NaN not read); one host sync, once per process
    return bool((acc == 3).all() and (fresh == 2).all())


def _reference_rows(logits: torch.Tensor, target: torch.Tensor, row_loss: torch.Tensor, ignore_index: int) -> None:
    """The per-row step in plain torch: row losses into `row_loss`, softmax − onehot over `logits` (0 where the
    target is ignored)."""
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    x = logits.float()
    lse = torch.logsumexp(x, dim=1)
    picked = x.gather(1, safe[:, None]).squeeze(1)
    row_loss.copy_(torch.where(valid, lse - picked, 0.0))
    grad = torch.exp(x - lse[:, None])
    grad.scatter_add_(1, safe[:, None], torch.full_like(picked, -1.0)[:, None])
    grad *= valid[:, None]
    logits.copy_(grad)


@functools.cache
def _triton_rows():
    """The per-row Triton kernel's launcher, or None without triton (the reference path runs then)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        from turbotrain.log import say

        say("kernels.fused_loss: triton is not installed; the plain-torch reference path runs on the GPU")
        return None

    @triton.jit
    def ce_rows(logits_ptr, stride, target_ptr, loss_ptr, n_cols, ignore_index, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        ptr = logits_ptr + row * stride
        y = tl.load(target_ptr + row)
        valid = y != ignore_index
        y = tl.where(valid, y, 0)
        # pass 1: online softmax (running max and sum of exponentials), fp32
        m = float("-inf")
        s = 0.0
        for off in range(0, n_cols, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            # evict_last: pass 2 reads the row again, from L2 rather than HBM
            x = tl.load(ptr + cols, mask=cols < n_cols, other=float("-inf"), eviction_policy="evict_last")
            x = x.to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
        lse = m + tl.log(s)
        picked = tl.load(ptr + y).to(tl.float32)  # read before pass 2 overwrites the row
        tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
        scale = tl.where(valid, 1.0, 0.0)
        # pass 2: d(logits) = softmax - onehot over the logits (1/N comes in backward)
        for off in range(0, n_cols, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(ptr + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            g = tl.exp(x - lse)
            g = tl.where(cols == y, g - 1.0, g) * scale
            tl.store(ptr + cols, g.to(logits_ptr.dtype.element_ty), mask=mask)

    def launch(logits, target, row_loss, ignore_index):
        n_rows, n_cols = logits.shape
        # swept on an H200 (GPT-2's and Llama-1B's logits): 8192 x 16 warps ran GPT-2's rows in 1.19 ms where
        # 32768 x 32 took 1.54 (a copy of the same bytes: 0.77); Llama-1B's within 1 % of the best
        block = min(8192, triton.next_power_of_2(n_cols))
        ce_rows[(n_rows,)](logits, logits.stride(0), target, row_loss, n_cols, ignore_index,
                           BLOCK=block, num_warps=16 if block >= 8192 else 4 if block <= 1024 else 8)

    return launch

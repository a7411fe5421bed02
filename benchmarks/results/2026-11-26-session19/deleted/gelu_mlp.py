"""A transformer's GELU MLP with the activation inside the matmuls (`kernels.gelu_mlp`):
`out(gelu(fc(x), approximate="tanh"))` as one op whose GEMMs carry the GELU in their epilogues.

Why. Compiled, the MLP is two cuBLAS GEMMs and Triton kernels around them: GELU forward reads the fc output and
writes the activation; backward reads the fc output and the activation's gradient to write the fc output's
gradient, and sums it for fc's bias gradient. At GPT-2 small's shapes each such pass moves a [tokens × 4·d]
bf16 tensor several times. cuBLASLt does the same arithmetic in the GEMMs' epilogues (accel/cublaslt.py):
  forward:  h, pre = gelu(x @ W1ᵀ + b1), x @ W1ᵀ + b1     (one GEMM, GELU_AUX_BIAS)
            y = h @ W2ᵀ + b2                               (torch's addmm, bias epilogue)
  backward: dW2 = dyᵀ h, db2 = Σ dy                        (torch)
            dpre, db1 = (dy @ W2) · gelu'(pre), Σ dpre      (one GEMM, DGELU_BGRAD)
            dW1 = dpreᵀ x, dx = dpre @ W1                   (torch)
The math is the layers' (tanh GELU, fp32 accumulation, bf16/fp16 storage); what differs is rounding: GELU is
applied to the fp32 accumulator before it is rounded, where the layers round the fc output first. `h` is kept
for backward (the forward GEMM writes it anyway) where compiled layers keep only `pre` and recompute `h`: one
[tokens × 4·d] tensor more per block in activation memory.

Reference path (CPU, or a GPU where cuBLASLt cannot be called): the same op in plain torch, used by the tests to
check the autograd formula against torch's own. The op is a `torch.library.custom_op` with its autograd
registered on it, so compiled graphs (CUDA graphs included) hold it as one node.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from turbotrain.accel import cublaslt


def gelu_mlp(x: torch.Tensor, fc: nn.Linear, out: nn.Linear) -> torch.Tensor:
    """`out(gelu(fc(x), approximate="tanh"))`, fused where it can be (see `fusible`), else exactly that."""
    dtype = torch.get_autocast_dtype("cuda") if x.is_cuda and torch.is_autocast_enabled("cuda") else x.dtype
    if not fusible(x, fc, out, dtype):
        return out(F.gelu(fc(x), approximate="tanh"))
    lead = x.shape[:-1]
    cast = (t.to(dtype).contiguous() for t in (x.reshape(-1, x.shape[-1]), fc.weight, fc.bias, out.weight, out.bias))
    y = torch.ops.turbotrain.gelu_mlp(*cast)[0]
    return y.reshape(*lead, y.shape[-1])


def fusible(x, fc: nn.Module, out: nn.Module, dtype: torch.dtype) -> bool:
    """True where the fused op computes what the layers would: plain nn.Linears with biases (not FP8 or adapter
    subclasses, no hooks of the user's — they would not run), plain tensors (not DTensors), a bf16/fp16 compute
    dtype on a CUDA device, widths the GEMMs' alignment rules take, and cuBLASLt callable."""
    if not (isinstance(x, torch.Tensor) and x.is_cuda and dtype in (torch.bfloat16, torch.float16) and x.numel()):
        return False
    if type(fc) is not nn.Linear or type(out) is not nn.Linear or fc.bias is None or out.bias is None:
        return False
    if fc.out_features != out.in_features or x.shape[-1] != fc.in_features or x.dtype not in (
            torch.float32, torch.bfloat16, torch.float16):
        return False
    if any(n % 8 for n in (fc.in_features, fc.out_features, out.out_features)):
        return False
    if any(m._forward_hooks or m._forward_pre_hooks for m in (fc, out)) or _global_hooks():
        return False
    params = (fc.weight, fc.bias, out.weight, out.bias)
    if any(type(p) not in (torch.Tensor, nn.Parameter) or not p.is_cuda for p in params):
        return False
    return _lt_available()


def _global_hooks() -> bool:
    from torch.nn.modules import module

    return bool(module._global_forward_hooks or module._global_forward_pre_hooks)


@functools.cache
def _lt_available() -> bool:
    return cublaslt.available()


@torch.library.custom_op("turbotrain::gelu_mlp", mutates_args=())
def _gelu_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, pre): pre = x @ w1ᵀ + b1, h = gelu_tanh(pre), y = h @ w2ᵀ + b2; x: [M, d], w1: [H, d], w2: [d', H]."""
    with torch.autocast(x.device.type, enabled=False):  # the dtypes are the caller's
        return _forward(x, w1, b1, w2, b2)


def _forward(x, w1, b1, w2, b2):
    if x.is_cuda and _lt_available():
        h, pre = x.new_empty(x.shape[0], w1.shape[0]), x.new_empty(x.shape[0], w1.shape[0])
        cublaslt.matmul(x, w1.t(), h, cublaslt.EPILOGUE_GELU_AUX_BIAS, bias=b1, aux=pre)
    else:
        pre = torch.addmm(b1, x, w1.t())
        h = F.gelu(pre, approximate="tanh")
    return torch.addmm(b2, h, w2.t()), h, pre


@_gelu_mlp.register_fake
def _(x, w1, b1, w2, b2):
    hidden = x.new_empty(x.shape[0], w1.shape[0])
    return x.new_empty(x.shape[0], w2.shape[0]), hidden, torch.empty_like(hidden)


@torch.library.custom_op("turbotrain::gelu_mlp_backward", mutates_args=())
def _gelu_mlp_backward(dy: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, h: torch.Tensor,
                       pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                   torch.Tensor]:
    """(dx, dw1, db1, dw2, db2) of `gelu_mlp` for the output gradient dy."""
    with torch.autocast(dy.device.type, enabled=False):
        return _backward_impl(dy, x, w1, w2, h, pre)


def _backward_impl(dy, x, w1, w2, h, pre):
    # cuBLASLt's DGELU_BGRAD epilogue runs as a separate, slower kernel after the GEMM on Hopper (NOTES, session
    # 19), so backward is torch's: dh = dy @ w2 (cuBLAS), GELU's gradient in one pass over dh and pre
    dpre = torch.ops.aten.gelu_backward(dy @ w2, pre, approximate="tanh")
    return dpre @ w1, dpre.t() @ x, dpre.sum(0), dy.t() @ h, dy.sum(0)


@_gelu_mlp_backward.register_fake
def _(dy, x, w1, w2, h, pre):
    return (torch.empty_like(x), torch.empty_like(w1), pre.new_empty(pre.shape[1]), torch.empty_like(w2),
            dy.new_empty(dy.shape[1]))


def _setup_context(ctx, inputs, output) -> None:
    ctx.set_materialize_grads(False)  # h's and pre's gradients are never used: no zero tensors for them
    x, w1, _, w2, _ = inputs
    _, h, pre = output
    ctx.save_for_backward(x, w1, w2, h, pre)


def _backward(ctx, dy, *_unused):
    """Only y is differentiated: h and pre are the forward's by-products, kept for this."""
    if dy is None:
        return None, None, None, None, None
    x, w1, w2, h, pre = ctx.saved_tensors
    return torch.ops.turbotrain.gelu_mlp_backward(dy.contiguous(), x, w1, w2, h, pre)


_gelu_mlp.register_autograd(_backward, setup_context=_setup_context)

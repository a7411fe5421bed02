"""Batch norm, ReLU and max pool in one layer (`kernels.convnet`): the convnet stem's `BatchNorm2d → ReLU →
MaxPool2d` computed by Triton kernels that never write the full-resolution activation.

Why. Unfused, a ResNet stem's batch norm output is the largest activation of the network (64 channels at half
the image's resolution): it is written, read back by the pool, and in the backward its gradient is written by
the pool, masked by the ReLU and read twice by the batch norm's two passes. Fused, the forward reads the
convolution's output twice (statistics, then normalise-and-pool) and writes only the pooled output, its int8
argmax offsets and the input value there; the backward takes the batch norm's two channel sums over the pooled
outputs (only an argmax receives a gradient) and writes the input gradient in one pass.

Same math as the three layers: batch statistics in fp32 (biased variance to normalise, unbiased into the running
variance, torch's momentum rule), relu(batch_norm(x)) rounded to the activation dtype before pooling, torch's
pool rules (first maximum, NaN wins), the gradient routed to each window's argmax. It differs from the unfused
graph only in summation order, and in keeping the gradient at the ReLU in fp32 where the unfused graph rounds it
to the activation dtype.

What is fused: each run of three consecutive children of an `nn.Sequential` — `nn.BatchNorm2d`, `nn.ReLU`,
`nn.MaxPool2d` (dilation 1, no ceil_mode, no indices) — at every call where none of the three has a hook and the
kernels serve the input (CUDA, channels_last, momentum not None, a shape torch accepts). The Sequential becomes a
`FusedSequential`, whose forward runs such runs fused and everything else as nn.Sequential does; the children stay
torch's own modules, so calling one directly, slicing the Sequential, replacing a child or hooking it later all
see torch's layers. Parameters, buffers and state_dict are unchanged; switching off restores nn.Sequential.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from turbotrain.accel.convnet import max_pool


class FusedSequential(nn.Sequential):
    """nn.Sequential whose forward runs each fusible BatchNorm2d → ReLU → MaxPool2d run of its children as one
    fused layer."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # nn.Sequential's argument name
        if torch.jit.is_scripting():
            for m in self:
                input = m(input)
            return input
        return self._forward_fused(input)

    @torch.jit.unused
    def _forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.fx.Proxy):  # symbolic tracing: torch's layers, as the graph shows them
            return super().forward(x)
        kids = list(self)
        i = 0
        while i < len(kids):
            y = _fused(kids[i], kids[i + 1], kids[i + 2], x) if i + 2 < len(kids) else None
            if y is None:
                x, i = kids[i](x), i + 1
            else:
                x, i = y, i + 3
        return x


def available() -> bool:
    return max_pool.kernels() is not None


def set_fused(model: nn.Module, on: bool) -> int:
    """`model`'s Sequentials holding a fusible run as FusedSequential (on, where triton is installed) or back to
    nn.Sequential, in place; the number of runs found."""
    runs = 0
    for m in model.modules():
        if type(m) in (nn.Sequential, FusedSequential):
            kids = list(m)
            found = sum(1 for run in zip(kids, kids[1:], kids[2:]) if _fusible(*run)) if on and available() else 0
            m.__class__ = FusedSequential if found else nn.Sequential
            runs += found
    return runs


def _fusible(bn: nn.Module, relu: nn.Module, pool: nn.Module) -> bool:
    """Whether the fused layer computes pool(relu(bn(x))) for these modules: torch's classes with their own
    forwards (none set on an instance), no hooks (global ones included), a pool the kernels cover."""
    if not (type(bn) is nn.BatchNorm2d and type(relu) is nn.ReLU and max_pool.is_pool(pool)):
        return False
    hooked = any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                 or "forward" in vars(m) for m in (bn, relu, pool))
    hooked = hooked or any(getattr(nn.modules.module, name) for name in _GLOBAL_HOOKS)
    k, s, _ = max_pool.geometry(pool)
    return (not hooked and _pair(pool.dilation) == (1, 1) and not pool.ceil_mode and not pool.return_indices
            and max(k) <= 11 and min(s) > 0)


_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _fused(bn: nn.Module, relu: nn.Module, pool: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """pool(relu(bn(x))) by the fused kernels, updating bn's running statistics as it would; None where they do
    not serve this call (the caller runs the three modules)."""
    if not _fusible(bn, relu, pool):
        return None
    k, s, p = max_pool.geometry(pool)
    batch_stats = bn.training or bn.running_mean is None
    update = bn.training and bn.track_running_stats
    if not (max_pool.fast_path(x, k, s, p, 1, False) and x.shape[1] == bn.num_features
            and (not batch_stats or x.numel() > x.shape[1]) and not (update and bn.momentum is None)):
        return None
    if update:
        bn.num_batches_tracked.add_(1)
    c = x.shape[1]
    weight = bn.weight if bn.affine else torch.ones(c, device=x.device)
    bias = bn.bias if bn.affine else torch.zeros(c, device=x.device)
    out, _, _, mean, var = torch.ops.turbotrain.bn_relu_max_pool2d(
        x, weight, bias, bn.running_mean, bn.running_var, batch_stats, bn.eps, list(k), list(s), list(p))
    if update:
        with torch.no_grad():
            n = x.numel() // c
            bn.running_mean.mul_(1 - bn.momentum).add_(mean, alpha=bn.momentum)
            bn.running_var.mul_(1 - bn.momentum).add_(var * (n / (n - 1)), alpha=bn.momentum)
    return out


def _empty_outputs(x: torch.Tensor, kernel, stride, padding):
    n, c = x.shape[:2]
    oh, ow = max_pool.out_hw(x, kernel, stride, padding)
    return (torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device, memory_format=torch.channels_last),
            torch.empty((n, oh, ow, c), dtype=torch.int8, device=x.device),
            torch.empty((n, oh, ow, c), dtype=x.dtype, device=x.device))


@torch.library.custom_op("turbotrain::bn_relu_max_pool2d", mutates_args=())
def _fused_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor | None,
              running_var: torch.Tensor | None, batch_stats: bool, eps: float, kernel: list[int],
              stride: list[int], padding: list[int]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pooled output in channels_last, int8 argmax offsets [N, OH, OW, C], the input at each argmax
    [N, OH, OW, C], the fp32 mean and biased variance used to normalise)."""
    out, offsets, xmax = _empty_outputs(x, kernel, stride, padding)
    kernels = max_pool.kernels()
    if batch_stats:
        mean, var = kernels.batch_stats(x)
    else:
        mean, var = (t.to(torch.float32, copy=True) for t in (running_mean, running_var))
    kernels.bn_relu_pool_forward(x, mean, var, weight, bias, eps, out, offsets, xmax, kernel, stride, padding)
    return out, offsets, xmax, mean, var


@_fused_op.register_fake
def _(x, weight, bias, running_mean, running_var, batch_stats, eps, kernel, stride, padding):
    c = x.shape[1]
    return (*_empty_outputs(x, kernel, stride, padding),
            *(torch.empty(c, dtype=torch.float32, device=x.device) for _ in range(2)))


@torch.library.custom_op("turbotrain::bn_relu_max_pool2d_backward", mutates_args=())
def _fused_backward(grad: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, xmax: torch.Tensor,
                    weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                    batch_stats: bool, eps: float, kernel: list[int], stride: list[int], padding: list[int]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input gradient in channels_last, weight gradient, bias gradient)."""
    dx = torch.empty_like(x, memory_format=torch.channels_last)
    dweight, dbias = max_pool.kernels().bn_relu_pool_backward(
        grad.contiguous(memory_format=torch.channels_last), offsets, x, xmax, mean, var, weight, bias, eps,
        batch_stats, dx, kernel, stride, padding)
    return dx, dweight.to(weight.dtype), dbias.to(bias.dtype)


@_fused_backward.register_fake
def _(grad, x, offsets, xmax, weight, bias, mean, var, batch_stats, eps, kernel, stride, padding):
    return torch.empty_like(x, memory_format=torch.channels_last), torch.empty_like(weight), torch.empty_like(bias)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _, _, batch_stats, eps, kernel, stride, padding = inputs
    _, offsets, xmax, mean, var = output
    ctx.save_for_backward(x, offsets, xmax, weight, bias, mean, var)
    ctx.args = (batch_stats, eps, kernel, stride, padding)
    ctx.mark_non_differentiable(offsets, xmax, mean, var)


def _backward(ctx, grad_out, *_):
    x, offsets, xmax, weight, bias, mean, var = ctx.saved_tensors
    dx, dweight, dbias = torch.ops.turbotrain.bn_relu_max_pool2d_backward(grad_out, x, offsets, xmax, weight, bias,
                                                                          mean, var, *ctx.args)
    need = ctx.needs_input_grad
    return (dx if need[0] else None, dweight if need[1] else None, dbias if need[2] else None,
            None, None, None, None, None, None, None)


_fused_op.register_autograd(_backward, setup_context=_setup_context)

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

What is fused: three consecutive children of an `nn.Sequential` — `nn.BatchNorm2d`, `nn.ReLU`, `nn.MaxPool2d`
(dilation 1, no ceil_mode, no indices), none with hooks or registered twice — and torchvision's ResNet stem
(`bn1`, `relu`, `maxpool`, whose forward calls them in that order and `relu` nowhere else). The batch norm
module becomes `BatchNormReLUMaxPool2d` and does all three; the ReLU and the pool pass their input through.
Parameters, buffers and state_dict are unchanged; switching off restores torch's classes. A call the kernels do
not serve (CPU, not channels_last, momentum None, a shape torch refuses) runs the three layers as torch does.
"""
from __future__ import annotations

import functools
import sys
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from turbotrain.accel.convnet import max_pool


class BatchNormReLUMaxPool2d(nn.BatchNorm2d):
    """nn.BatchNorm2d that also applies the ReLU and the max pool fused into it (`pool`: kernel, stride,
    padding as pairs)."""
    pool: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, s, p = self.pool
        batch_stats = self.training or self.running_mean is None
        update = self.training and self.track_running_stats
        if not (max_pool.fast_path(x, k, s, p, 1, False) and x.shape[1] == self.num_features
                and (not batch_stats or x.numel() > x.shape[1]) and not (update and self.momentum is None)):
            return self._unfused(x)
        if update:
            self.num_batches_tracked.add_(1)
        c = x.shape[1]
        weight = self.weight if self.affine else torch.ones(c, device=x.device)
        bias = self.bias if self.affine else torch.zeros(c, device=x.device)
        out, _, _, mean, var = torch.ops.turbotrain.bn_relu_max_pool2d(
            x, weight, bias, self.running_mean, self.running_var, batch_stats, self.eps, list(k), list(s), list(p))
        if update:
            with torch.no_grad():
                n = x.numel() // c
                self.running_mean.mul_(1 - self.momentum).add_(mean, alpha=self.momentum)
                self.running_var.mul_(1 - self.momentum).add_(var * (n / (n - 1)), alpha=self.momentum)
        return out

    def _unfused(self, x: torch.Tensor) -> torch.Tensor:
        """The three layers as the user built them (the max pool by its own Triton kernels where they apply)."""
        y = F.relu(super().forward(x))
        k, s, p = self.pool
        if max_pool.fast_path(y, k, s, p, 1, False):
            return torch.ops.turbotrain.max_pool2d_nhwc(y, list(k), list(s), list(p))[0]
        return F.max_pool2d(y, k, s, p)


class FusedReLU(nn.ReLU):
    """A ReLU applied by the BatchNormReLUMaxPool2d before it: passes its input through."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return "fused into the batch norm before it"


class FusedMaxPool2d(nn.MaxPool2d):
    """A max pool applied by the BatchNormReLUMaxPool2d before it: passes its input through."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fused into the batch norm before it"


def available() -> bool:
    return _kernels() is not None


def set_fused(model: nn.Module, on: bool) -> int:
    """Every fusible run of `model` fused (on, where triton is installed) or back to torch's three layers, in
    place; the number of runs fused."""
    for m in model.modules():
        if type(m) is BatchNormReLUMaxPool2d:
            m.__class__ = nn.BatchNorm2d
            del m.pool
        elif type(m) is FusedReLU:
            m.__class__ = nn.ReLU
        elif type(m) is FusedMaxPool2d:
            m.__class__ = nn.MaxPool2d
    if not (on and available()):
        return 0
    runs = fusible_runs(model)
    for bn, relu, pool in runs:
        bn.__class__, relu.__class__ = BatchNormReLUMaxPool2d, FusedReLU
        bn.pool = max_pool.geometry(pool)
        pool.__class__ = FusedMaxPool2d
    return len(runs)


def fusible_runs(model: nn.Module) -> list[tuple[nn.Module, nn.Module, nn.Module]]:
    """The (batch norm, ReLU, max pool) triples of `model` whose forward is known to call them in a row."""
    uses = Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    runs = []
    for m in model.modules():
        if type(m) is nn.Sequential:
            kids = list(m)
            runs += zip(kids, kids[1:], kids[2:])
        elif _is_torchvision_resnet(m):
            runs.append((m.bn1, m.relu, m.maxpool))
    return [run for run in runs if _fusible(*run) and all(uses[id(x)] == 1 for x in run)]


def _fusible(bn: nn.Module, relu: nn.Module, pool: nn.Module) -> bool:
    if not (type(bn) is nn.BatchNorm2d and type(relu) is nn.ReLU and max_pool.is_pool(pool)):
        return False
    hooked = any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                 for m in (bn, relu, pool))
    k, _, _ = max_pool.geometry(pool)
    return (not hooked and pool.dilation in (1, (1, 1)) and not pool.ceil_mode and not pool.return_indices
            and max(k) <= 11)


def _is_torchvision_resnet(m: nn.Module) -> bool:
    """torchvision's ResNet with its own forward (stem: conv1, bn1, relu, maxpool; relu used only there)."""
    resnet = getattr(sys.modules.get("torchvision.models.resnet"), "ResNet", None)
    return (resnet is not None and isinstance(m, resnet) and type(m).forward is resnet.forward
            and type(m)._forward_impl is resnet._forward_impl)


def _out_hw(x: torch.Tensor, kernel, stride, padding) -> tuple[int, int]:
    return tuple((n + 2 * p - k) // s + 1 for n, k, s, p in zip(x.shape[2:], kernel, stride, padding))


def _empty_outputs(x: torch.Tensor, kernel, stride, padding):
    n, c = x.shape[:2]
    oh, ow = _out_hw(x, kernel, stride, padding)
    return (torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device, memory_format=torch.channels_last),
            torch.empty((n, oh, ow, c), dtype=torch.int8, device=x.device),
            torch.empty((n, oh, ow, c), dtype=x.dtype, device=x.device))


@torch.library.custom_op("turbotrain::bn_relu_max_pool2d", mutates_args=())
def _fused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor | None,
           running_var: torch.Tensor | None, batch_stats: bool, eps: float, kernel: list[int], stride: list[int],
           padding: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pooled output in channels_last, int8 argmax offsets [N, OH, OW, C], the input at each argmax
    [N, OH, OW, C], the fp32 mean and biased variance used to normalise)."""
    out, offsets, xmax = _empty_outputs(x, kernel, stride, padding)
    if batch_stats:
        mean, var = _kernels().batch_stats(x)
    else:
        mean, var = (t.to(torch.float32, copy=True) for t in (running_mean, running_var))
    _kernels().bn_relu_pool_forward(x, mean, var, weight, bias, eps, out, offsets, xmax, kernel, stride, padding)
    return out, offsets, xmax, mean, var


@_fused.register_fake
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
    dweight, dbias = _kernels().bn_relu_pool_backward(grad.contiguous(memory_format=torch.channels_last), offsets,
                                                      x, xmax, mean, var, weight, bias, eps, batch_stats, dx,
                                                      kernel, stride, padding)
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


_fused.register_autograd(_backward, setup_context=_setup_context)


@functools.cache
def _kernels():
    """The module of the kernels' launchers, or None without triton."""
    try:
        from turbotrain.accel.convnet import pool_kernels
    except ImportError:
        return None
    return pool_kernels

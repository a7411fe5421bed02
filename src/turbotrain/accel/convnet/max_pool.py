"""Max pooling on channels_last tensors by two Triton kernels (`kernels.convnet`): the same result and
gradient as `F.max_pool2d`, faster where inductor's own lowering is slow.

Why. In a compiled ResNet-50 step the stem's 3×3/2 max pool takes several times what its bytes need at HBM
speed: inductor's backward visits every input element through the four windows that may hold it, with index
arithmetic it cannot vectorise along the channels. Here both kernels work on NHWC blocks of [pixels ×
channels], so every load is a contiguous run of channels, and the window's argmax is kept as an int8 offset
(1 byte per output, not 8).

Semantics follow PyTorch's kernels: within a window the first maximum in row-major order wins, a NaN wins over
any number (and a later NaN over an earlier one); the backward sums, in fp32, the gradient of every window whose
argmax is the element. A window holding only -inf gives its gradient to its first in-bounds element, as torch's
CPU and NCHW CUDA kernels do (its channels_last CUDA kernel gives it to pixel (0, 0), outside the window).
Supported: 2-D pooling, dilation 1, ceil_mode off, window ≤ 11, on a CUDA tensor in channels_last with triton
installed; any other call (an empty batch too) runs nn.MaxPool2d's own forward (the CPU tests' reference path).
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn.modules.utils import _pair


def fast_path(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int],
              dilation, ceil_mode: bool) -> bool:
    """Whether the Triton kernels serve this call; else nn.MaxPool2d's own forward runs, and with it torch's
    argument checks (padding at most half the window, a non-empty output). Triton's presence is checked once,
    by `set_max_pools`."""
    return (x.is_cuda and x.dim() == 4 and x.numel() > 0 and not ceil_mode and _pair(dilation) == (1, 1)
            and max(kernel) <= 11
            and all(0 <= p <= k // 2 for p, k in zip(padding, kernel)) and min(stride) > 0
            and min(out_hw(x, kernel, stride, padding)) > 0
            and x.is_contiguous(memory_format=torch.channels_last)
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32))


class MaxPool2dNHWC(nn.MaxPool2d):
    """nn.MaxPool2d whose forward runs the Triton kernels where they apply (no state of its own: the swap
    changes no state_dict and `export` writes the plain module's weights)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, s, p = geometry(self)
        if self.return_indices or not fast_path(x, k, s, p, self.dilation, self.ceil_mode):
            return super().forward(x)
        return torch.ops.turbotrain.max_pool2d_nhwc(x, list(k), list(s), list(p))[0]


def geometry(pool: nn.MaxPool2d) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(kernel, stride, padding) of `pool` as pairs (no stride, None or empty, is the kernel's, as torch reads
    it; a stride of 0 stays 0, which torch refuses)."""
    stride = pool.stride if pool.stride is not None and pool.stride != () and pool.stride != [] else pool.kernel_size
    return _pair(pool.kernel_size), _pair(stride), _pair(pool.padding)


def is_pool(m: nn.Module) -> bool:
    """An nn.MaxPool2d (or one already rewritten); user subclasses are left alone."""
    return type(m) in (nn.MaxPool2d, MaxPool2dNHWC)


def available() -> bool:
    return kernels() is not None


def set_max_pools(model: nn.Module, on: bool) -> int:
    """Every max pool of `model` (`is_pool`) as MaxPool2dNHWC (on, where triton is installed) or nn.MaxPool2d,
    in place; the number set to MaxPool2dNHWC."""
    on = on and available()
    pools = [m for m in model.modules() if is_pool(m)]
    for m in pools:
        m.__class__ = MaxPool2dNHWC if on else nn.MaxPool2d
    return len(pools) if on else 0


def out_hw(x: torch.Tensor, kernel, stride, padding) -> tuple[int, ...]:
    """The pooled output's height and width for `x` ([N, C, H, W])."""
    return tuple((n + 2 * p - k) // s + 1 for n, k, s, p in zip(x.shape[2:], kernel, stride, padding))


@torch.library.custom_op("turbotrain::max_pool2d_nhwc", mutates_args=())
def _max_pool(x: torch.Tensor, kernel: list[int], stride: list[int], padding: list[int]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output in channels_last, int8 argmax offset within each window as [N, OH, OW, C])."""
    n, c = x.shape[:2]
    oh, ow = out_hw(x, kernel, stride, padding)
    out = torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    offsets = torch.empty((n, oh, ow, c), dtype=torch.int8, device=x.device)
    kernels().max_pool_forward(x, out, offsets, kernel, stride, padding)
    return out, offsets


@_max_pool.register_fake
def _(x, kernel, stride, padding):
    n, c = x.shape[:2]
    oh, ow = out_hw(x, kernel, stride, padding)
    return (torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device, memory_format=torch.channels_last),
            torch.empty((n, oh, ow, c), dtype=torch.int8, device=x.device))


@torch.library.custom_op("turbotrain::max_pool2d_nhwc_backward", mutates_args=())
def _max_pool_backward(grad: torch.Tensor, offsets: torch.Tensor, input_hw: list[int], kernel: list[int],
                       stride: list[int], padding: list[int]) -> torch.Tensor:
    n, c = grad.shape[:2]
    gin = torch.empty((n, c, *input_hw), dtype=grad.dtype, device=grad.device, memory_format=torch.channels_last)
    kernels().max_pool_backward(grad.contiguous(memory_format=torch.channels_last), offsets, gin, kernel, stride,
                                  padding)
    return gin


@_max_pool_backward.register_fake
def _(grad, offsets, input_hw, kernel, stride, padding):
    n, c = grad.shape[:2]
    return torch.empty((n, c, *input_hw), dtype=grad.dtype, device=grad.device, memory_format=torch.channels_last)


def _setup_context(ctx, inputs, output) -> None:
    x, kernel, stride, padding = inputs
    ctx.save_for_backward(output[1])
    ctx.args = (list(x.shape[2:]), kernel, stride, padding)


def _backward(ctx, grad_out, _grad_offsets):
    (offsets,) = ctx.saved_tensors
    return torch.ops.turbotrain.max_pool2d_nhwc_backward(grad_out, offsets, *ctx.args), None, None, None


_max_pool.register_autograd(_backward, setup_context=_setup_context)


@functools.cache
def kernels():
    """The module of the kernels' launchers, or None without triton."""
    try:
        from turbotrain.accel.convnet import pool_kernels
    except ImportError:
        return None
    return pool_kernels

"""A convnet's stem convolution as space-to-depth (`kernels.convnet`): a stride-2 conv over few input channels
computed as a stride-1 conv over a 2×2 space-to-depth of its input, with the same products and sums.

Why. cuDNN runs a conv over 3 input channels (an RGB stem) poorly on tensor cores: it pads the channels to 8 in
an extra kernel each call and runs an old, slow kernel (a few percent of ResNet-50's step). Rearranging every
2×2 patch of pixels into channels turns the 7×7/2 conv over 3 channels into a 4×4/1 conv over 12 (16 with zero
channels; the weight zero-padded to 8×8 and rearranged the same way), which tensor cores run as a plain
implicit GEMM: the same multiply-adds plus exact zeros, in another summation order. This is the stem transform
of the MLPerf ResNet submissions on TPUs.

The module keeps its own weight (state_dict, checkpoints and `export` unchanged): only its forward is
rearranged, and autograd maps the gradient back to the 7×7 weight.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MAX_CHANNELS = 4  # at 8 and more input channels cuDNN's own kernels are efficient


def is_stem(m: nn.Module) -> bool:
    """A conv this transform applies to (or already rewritten): 2-D, stride 2, few input channels, zero numeric
    padding, no dilation or groups; user subclasses of nn.Conv2d are left alone."""
    return (type(m) in (nn.Conv2d, SpaceToDepthConv2d) and m.stride == (2, 2) and m.in_channels <= MAX_CHANNELS
            and m.groups == 1 and m.dilation == (1, 1) and m.padding_mode == "zeros" and not isinstance(m.padding, str)
            and m.kernel_size[0] > 2 and m.kernel_size[1] > 2)


class SpaceToDepthConv2d(nn.Conv2d):
    """nn.Conv2d (stride 2, few channels) whose forward is the space-to-depth form: equal outputs and weight
    gradients up to summation order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:  # unbatched, or torch's own error for wrong channels
            return super().forward(x)
        return space_to_depth_conv(x, self.weight, self.bias, self.padding)


def set_stems(model: nn.Module, on: bool) -> int:
    """Every stem-like conv of `model` (`is_stem`) as SpaceToDepthConv2d (on) or nn.Conv2d (off), in place;
    the number of stems."""
    stems = [m for m in model.modules() if is_stem(m)]
    for m in stems:
        m.__class__ = SpaceToDepthConv2d if on else nn.Conv2d
    return len(stems)


def space_to_depth_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        padding: tuple[int, int]) -> torch.Tensor:
    """`F.conv2d(x, weight, bias, stride=2, padding=padding)` as a stride-1 conv on x's 2×2 space-to-depth."""
    (h, w), (kh, kw) = x.shape[-2:], weight.shape[-2:]
    nhwc = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    rows, cols = _plan(h, kh, padding[0]), _plan(w, kw, padding[1])
    # pad so each window starts on an even row/column: top/left by the padding rounded up to even, bottom/right
    # to the length the stride-1 conv needs (negative: crop rows no window reads)
    x = F.pad(x, (cols[0], cols[1], rows[0], rows[1]))
    channels = 8 * math.ceil(weight.shape[1] * 4 / 8)  # folded, to a multiple of 8 (the weight's: a static size)
    x = _fold(x, nhwc, channels)
    # the weight shifted by the same odd offset (a zero first row/column) and padded to an even size
    weight = F.pad(weight, (cols[2], cols[3], rows[2], rows[3]))
    return F.conv2d(x, _fold(weight, nhwc, channels), bias)


def _plan(size: int, k: int, pad: int) -> tuple[int, int, int, int]:
    """(input pad before, input pad after, weight pad before, weight pad after) along one axis."""
    odd = pad % 2
    k_even = -(-(k + odd) // 2) * 2
    out = (size + 2 * pad - k) // 2 + 1
    length = 2 * out + k_even - 2  # the stride-1 conv with k_even // 2 taps reads `out + k_even // 2 - 1` pairs
    return pad + odd, length - size - pad - odd, odd, k_even - k - odd


def _fold(t: torch.Tensor, nhwc: bool, channels: int) -> torch.Tensor:
    """[A, C, 2H, 2W] → [A, channels, H, W]: each 2×2 patch of pixels into channels (c, row parity, column
    parity), then zero channels up to `channels` (a multiple of 8), in the input's memory format (cuDNN's NHWC
    kernels need the channels innermost). cuDNN would pad 12 channels to 16 itself, in a kernel of its own on
    every call; here the padding happens inside the fold's one copy."""
    a, c, h, w = t.shape
    t = t.reshape(a, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(a, c * 4, h // 2, w // 2)
    t = F.pad(t, (0, 0, 0, 0, 0, channels - c * 4))
    return t.contiguous(memory_format=torch.channels_last if nhwc else torch.contiguous_format)

"""channels_last for convnets: NHWC lets cuDNN use tensor-core kernels without layout transposes."""
from __future__ import annotations

import torch
from torch import nn


def has_conv(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def resolve_channels_last(setting: bool | str, model: nn.Module, device: torch.device) -> bool:
    """"auto": on for convnets on a GPU (on CPU NHWC is rarely faster)."""
    if setting == "auto":
        return device.type == "cuda" and has_conv(model)
    return bool(setting)


def apply_channels_last(model: nn.Module) -> nn.Module:
    return model.to(memory_format=torch.channels_last)


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x

"""channels_last for convnets: NHWC lets cuDNN use tensor-core kernels without layout transposes."""
from __future__ import annotations

import torch
from torch import nn

from turbotrain.log import say


def has_conv(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def resolve_channels_last(setting: bool | str, model: nn.Module, device: torch.device) -> bool:
    """"auto": on for convnets on a GPU (on CPU NHWC is rarely faster)."""
    if setting == "auto":
        return device.type == "cuda" and has_conv(model)
    return bool(setting)


def apply_channels_last(model: nn.Module) -> nn.Module:
    """NHWC for every 4-D weight; a model without any (no convolution) is left as it is, and told so: the
    setting would otherwise read as applied."""
    if not any(p.dim() == 4 for p in model.parameters()):
        say("warning: memory.channels_last = true: the model has no 4-D (convolution) weights, the only ones "
            "NHWC lays out, so it changes nothing here; set memory.channels_last = \"auto\" or false")
        return model
    return model.to(memory_format=torch.channels_last)


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x

"""The attention kernel behind `F.scaled_dot_product_attention`.

PyTorch tries FlashAttention first. On Hopper (sm90: H100, H200) cuDNN's fused attention is faster for
training shapes at the same accuracy, so "auto" puts it first there; anywhere else the default order is
kept. It is a preference, not a restriction: shapes a backend cannot serve fall through to the next one.
The order must be in force while torch.compile traces (it picks the kernel at trace time), so the
trainer holds this context for the whole run.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Literal

import torch

from turbotrain.log import say


@dataclass
class KernelsConfig:
    """The `[kernels]` section."""

    attention: Literal["auto", "default", "cudnn", "flash", "efficient", "math"] = "default"
    """SDPA backend tried first ("auto": cuDNN on Hopper, torch's order elsewhere; a preference, not a restriction)."""
    fused_loss: bool = False
    """LM head + cross-entropy as one chunked op (Triton on GPU), no full logits; needs model `hidden` and `head`."""


def attention_backend(setting: str, device: torch.device) -> contextlib.AbstractContextManager:
    """`with attention_backend("auto", device): train...`"""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if setting == "default" or (setting == "auto" and not _is_hopper(device)):
        return contextlib.nullcontext()
    first = {"auto": SDPBackend.CUDNN_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "math": SDPBackend.MATH}[setting]
    rest = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    order = [first] + [b for b in rest if b != first]
    try:
        ctx = sdpa_kernel(order, set_priority=True)
    except TypeError:  # torch < 2.6 has no priority order
        say("attention: this torch cannot reorder SDPA backends; keeping its default order")
        return contextlib.nullcontext()
    say(f"attention: SDPA backends in order {', '.join(b.name.lower() for b in order)}")
    return ctx


def _is_hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9

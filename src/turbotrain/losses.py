"""Loss functions by name (`train.loss`): built-ins, the model's own loss, or the user's `pkg.module:fn`."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from turbotrain.plugins import load_object

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Logits (..., C) against integer targets (...), flattened; autocast runs it in fp32."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    y = y.to(out.dtype)
    if out.shape != y.shape and out.numel() == y.numel():
        y = y.reshape(out.shape)
    return F.mse_loss(out.float(), y.float())


def resolve_loss(name: str) -> LossFn | None:
    """None means the model computes its own loss from (inputs, targets)."""
    if name == "model":
        return None
    return {"cross_entropy": cross_entropy, "mse": mse}.get(name) or load_object(name, "train.loss")

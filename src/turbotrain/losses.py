"""Loss functions by name (`train.loss`): built-ins, the model's own loss, or the user's `pkg.module:fn`."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from turbotrain.errors import UserError
from turbotrain.plugins import load_object

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Logits (..., C) against integer targets (...), flattened; autocast runs it in fp32."""
    if out.dim() == 0 or out.numel() // max(out.shape[-1], 1) != y.numel():  # shapes only: no sync, traced away
        raise _shapes("cross_entropy needs logits (..., classes) for labels (...)", out, y)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if out.numel() != y.numel():
        raise _shapes("mse compares them element by element, so they need the same size", out, y)
    # both in fp32, the targets as given: cast to a bf16 (autocast) or integer output's dtype first, they would
    # be rounded, and the loss and its gradient computed against other targets
    return F.mse_loss(out.float(), y.reshape(out.shape).float())


def _shapes(need: str, out: torch.Tensor, y: torch.Tensor) -> UserError:
    """A step's output and targets that no longer fit (the first batch's did: the contract checked them)."""
    return UserError(f"the model's output has shape {tuple(out.shape)} and the targets {tuple(y.shape)} at this step; "
                     f"{need}; does the model's output shape change during training?")


def resolve_loss(name: str) -> LossFn | None:
    """None means the model computes its own loss from (inputs, targets)."""
    if name == "model":
        return None
    fn = {"cross_entropy": cross_entropy, "mse": mse}.get(name) or load_object(name, "train.loss")
    if isinstance(fn, type):  # nn.MSELoss: calling it builds a module from (outputs, targets)
        raise UserError(f"train.loss = {name!r} names the class {fn.__name__}, not a function; name a function "
                        "fn(outputs, targets) returning the loss (e.g. one calling torch.nn.functional.mse_loss)")
    return fn

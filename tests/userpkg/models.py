"""Model factories and loss functions, good and bad, for the fault tests.

    linear(dim=8)                a working model: forward(x (B, dim)) -> (B,)
    returns_int(dim=8)           a factory that returns 42, not an nn.Module
    needs_width(width, dim=8)    a factory with a required argument the config never gives
    nan_from_start(dim=8)        output is NaN from the first forward on
    nan_after(dim=8, after=6)    output turns NaN after `after` forwards in training mode
    CONSTANT                     not callable
    l1(out, y)                   a working loss
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CONSTANT = 3


class Linear(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).squeeze(-1)


def linear(dim: int = 8) -> nn.Module:
    return Linear(dim)


def returns_int(dim: int = 8) -> int:
    return 42


def needs_width(width: int, dim: int = 8) -> nn.Module:
    return Linear(dim)


class NaNFromStart(Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * float("nan")


def nan_from_start(dim: int = 8) -> nn.Module:
    return NaNFromStart(dim)


class NaNAfter(Linear):
    """Finite for the first `after` training forwards (a plain attribute, not state), NaN afterwards."""

    def __init__(self, dim: int, after: int):
        super().__init__(dim)
        self.after, self.calls = after, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            self.calls += 1
            if self.calls > self.after:
                out = out * float("nan")
        return out


def nan_after(dim: int = 8, after: int = 6) -> nn.Module:
    return NaNAfter(dim, after)


def l1(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.l1_loss(out.float(), y.float())

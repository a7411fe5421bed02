"""User code for tests/faults/test_redteam_s26_inputs.py: code that exits the process where turbotrain calls it
unguarded (a model's forward, a loss), and factories whose shape does not fit how turbotrain calls them.

    model.name = "userpkg.redteam_s26_inputs:exits_in_forward"   forward calls sys.exit(0) on training call `at`
    train.loss = "userpkg.redteam_s26_inputs:exiting_loss"        calls sys.exit(0)
    data.name  = "userpkg.redteam_s26_inputs:no_split"            dataset(n=64, dim=8): no split parameter
    data.name  = "userpkg.redteam_s26_inputs:returns_class"       returns the Dataset class, not an instance
    train.optimizer = "userpkg.redteam_s26_inputs:no_param_groups" optimizer factory without its param_groups
    model.name = "userpkg.redteam_s26_inputs:declared"          declared(dim: int = 8, scale: float = 1.0)
"""
from __future__ import annotations

import sys

import torch
from torch import nn
from userpkg.data import regression
from userpkg.regression import Regression


class ExitsInForward(nn.Module):
    def __init__(self, dim: int, at: int):
        super().__init__()
        self.fc, self.at, self.calls = nn.Linear(dim, 1), at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls >= self.at:
                sys.exit(0)
        return self.fc(x).squeeze(-1)


def exits_in_forward(dim: int = 8, at: int = 1) -> nn.Module:
    return ExitsInForward(dim, at)


def exiting_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    sys.exit(0)


def no_split(n: int = 64, dim: int = 8):
    return regression("train", n=n, dim=dim)


def returns_class(split: str, n: int = 64, dim: int = 8):
    return Regression


def no_param_groups(lr: float = 0.01, weight_decay: float = 0.0):
    raise AssertionError("never called: it cannot take the param_groups")


class Sized(nn.Module):
    def __init__(self, dim: int, scale: float):
        super().__init__()
        self.fc, self.scale = nn.Linear(dim, 1), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).squeeze(-1) * self.scale


def declared(dim: int = 8, scale: float = 1.0) -> nn.Module:
    """Declares its argument types: a config value of another kind is the config's mistake."""
    return Sized(dim, scale)

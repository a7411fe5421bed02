"""User code for tests/faults/test_redteam_s27_inputs.py: models holding a module whose __init__ never calls
super().__init__(), at the top or nested.

    model.name = "userpkg.redteam_s27_inputs:uninitialised"   the model itself skips nn.Module.__init__
    model.name = "userpkg.redteam_s27_inputs:nested"          a working model holding such a module in a ModuleList
"""
from __future__ import annotations

import torch
from torch import nn


class NoSuperInit(nn.Module):
    def __init__(self, dim: int = 8):  # the slip under test: no super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1)


class Nested(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, 1)
        self.blocks = nn.ModuleList([NoSuperInit(dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).squeeze(-1)


def uninitialised(dim: int = 8) -> nn.Module:
    return NoSuperInit(dim)


def nested(dim: int = 8) -> nn.Module:
    return Nested(dim)

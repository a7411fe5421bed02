"""Planted workloads for `turbotrain tune` (tests/faults/test_planted_s25_tune.py).

    coupled(dim=8, classes=4)        each sample's output depends on the others in its micro-batch (centred on
                                     the batch mean, no BatchNorm module): a micro-batch change changes the math
    per_sample(dim=8, classes=4)     the same layers without the centring: samples independent
    sum_loss(out, y)                 cross-entropy summed over the micro-batch: its scale follows the micro-batch
    nan_sometimes(dim=8, classes=4)  a linear model whose output is NaN on every 2nd training forward: the loss is
                                     non-finite at half the steps, never train.max_bad_steps (3) in a row
    items(split, n=256, dim=8)       an in-memory classification set
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Coupled(nn.Module):
    def __init__(self, dim: int, classes: int, centre: bool):
        super().__init__()
        self.lin, self.head, self.centre = nn.Linear(dim, dim), nn.Linear(dim, classes), centre

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.lin(x))
        return self.head(h - h.mean(0, keepdim=True) if self.centre else h)


def coupled(dim: int = 8, classes: int = 4) -> nn.Module:
    return Coupled(dim, classes, centre=True)


def per_sample(dim: int = 8, classes: int = 4) -> nn.Module:
    return Coupled(dim, classes, centre=False)


def sum_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="sum")


class NaNSometimes(nn.Linear):
    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            NaNSometimes.calls += 1
            if NaNSometimes.calls % 2 == 0:
                return out * float("nan")
        return out


def nan_sometimes(dim: int = 8, classes: int = 4) -> nn.Module:
    return NaNSometimes(dim, classes)


def items(split: str, n: int = 256, dim: int = 8, classes: int = 4):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    x = torch.randn(n, dim, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :classes].argmax(1))

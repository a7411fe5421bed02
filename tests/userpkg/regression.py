"""Noisy linear regression: y = x @ w + noise, with a fixed seed.

    data.name  = "userpkg.regression:dataset"          dataset(split, n=512, dim=8) -> Dataset of (x (dim,), y ())
    model.name = "userpkg.regression:build"            build(dim=8) -> nn.Module, forward(x) -> (B, 1)
    model.name = "userpkg.regression:build_with_loss"  build_with_loss(dim=8): forward(x, y) -> scalar loss
                                                       (use with train.loss = "model")
    train.loss = "userpkg.regression:huber"            huber(out, y) -> scalar loss
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

NOISE = 0.05


def true_weights(dim: int) -> torch.Tensor:
    return torch.randn(dim, generator=torch.Generator().manual_seed(7))


class Regression(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def dataset(split: str, n: int = 512, dim: int = 8) -> Regression:
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    x = torch.randn(n, dim, generator=g)
    y = x @ true_weights(dim) + NOISE * torch.randn(n, generator=g)
    return Regression(x, y)


def build(dim: int = 8) -> nn.Module:
    return nn.Linear(dim, 1)


class LinearWithLoss(nn.Module):
    """A model that computes its own loss: forward(x, y) -> mean squared error."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        pred = self.linear(x).squeeze(-1)
        if y is None:
            return pred
        return F.mse_loss(pred.float(), y.float())


def build_with_loss(dim: int = 8) -> LinearWithLoss:
    return LinearWithLoss(dim)


def huber(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.huber_loss(out.reshape(y.shape).float(), y.float(), delta=1.0)

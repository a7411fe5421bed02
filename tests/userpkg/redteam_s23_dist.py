"""Planted faults for the distributed red-team tests: user code that fails on one rank only.

    raises_on(split, rank=1, where="data", n=64, dim=8)   regression data; raises in __getitem__ on `rank`
    model_raises_on(dim=8, rank=1)                        a linear model whose forward raises on `rank`
    model_build_raises_on(dim=8, rank=1)                  the builder itself raises on `rank`
    loss_raises_on(rank=1)                                an mse loss that raises on `rank`
"""
from __future__ import annotations

import os

import torch
from torch import nn
from userpkg.data import regression
from userpkg.regression import Regression


def _here(rank: int) -> bool:
    return int(os.environ.get("RANK", "0")) == rank


class RaisesOn(Regression):
    def __init__(self, base: Regression, rank: int):
        super().__init__(base.x, base.y)
        self.fail = _here(rank)

    def __getitem__(self, i: int):
        if self.fail:
            raise ValueError("planted data fault on this rank")
        return super().__getitem__(i)


def raises_on(split: str, rank: int = 1, n: int = 64, dim: int = 8) -> Regression:
    base = regression(split, n, dim)
    return RaisesOn(base, rank) if split == "train" else base


class Linear(nn.Module):
    def __init__(self, dim: int, fail: bool):
        super().__init__()
        self.fc, self.fail = nn.Linear(dim, 1), fail

    def forward(self, x):
        if self.fail:
            raise ValueError("planted forward fault on this rank")
        return self.fc(x).squeeze(-1)


def model_raises_on(dim: int = 8, rank: int = 1) -> nn.Module:
    return Linear(dim, _here(rank))


def model_build_raises_on(dim: int = 8, rank: int = 1) -> nn.Module:
    if _here(rank):
        raise ValueError("planted build fault on this rank")
    return Linear(dim, False)


def model_differs_on(dim: int = 8, rank: int = 1) -> nn.Module:
    return Linear(dim + 1 if _here(rank) else dim, False)


def loss_raises_on(out: torch.Tensor, y: torch.Tensor, rank: int = 1) -> torch.Tensor:
    if _here(rank):
        raise ValueError("planted loss fault on this rank")
    return nn.functional.mse_loss(out, y)


class RaisesAfter(Regression):
    def __init__(self, base: Regression, rank: int, after: int):
        super().__init__(base.x, base.y)
        self.fail, self.after, self.calls = _here(rank), after, 0

    def __getitem__(self, i: int):
        self.calls += 1
        if self.fail and self.calls > self.after:
            raise ValueError("planted data fault on this rank, mid-run")
        return super().__getitem__(i)


def raises_after(split: str, rank: int = 1, after: int = 24, n: int = 64, dim: int = 8) -> Regression:
    base = regression(split, n, dim)
    return RaisesAfter(base, rank, after) if split == "train" else base


class NanAfter(nn.Module):
    """Output NaN from the `after`-th training forward on `rank` only."""

    def __init__(self, dim: int, rank: int, after: int):
        super().__init__()
        self.fc, self.fail, self.after, self.calls = nn.Linear(dim, 1), _here(rank), after, 0

    def forward(self, x):
        out = self.fc(x).squeeze(-1)
        if self.training:
            self.calls += 1
            if self.fail and self.calls > self.after:
                return out * float("nan")
        return out


def nan_on(dim: int = 8, rank: int = 1, after: int = 3) -> nn.Module:
    return NanAfter(dim, rank, after)


def sized_by_rank(split: str, n: int = 64, dim: int = 8) -> Regression:
    return regression(split, n + 16 * int(os.environ.get("RANK", "0")), dim)


class Tied(nn.Module):
    """Two layers sharing one weight (the second uses it transposed), as a tied embedding and head do."""

    def __init__(self, dim: int):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, 1)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.out(torch.relu(self.b(torch.relu(self.a(x))))).squeeze(-1)


def tied(dim: int = 8) -> nn.Module:
    return Tied(dim)


class Frozen(nn.Module):
    """A frozen first layer, a BatchNorm (running statistics: buffers) and a trained head."""

    def __init__(self, dim: int):
        super().__init__()
        self.stem, self.bn, self.head = nn.Linear(dim, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)
        self.stem.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.stem(x)))).squeeze(-1)


def frozen(dim: int = 8) -> nn.Module:
    return Frozen(dim)

"""Workloads for `turbotrain tune`'s tests: a small user model with repeated blocks and a host-bound dataset.

    build_model(dim=16, depth=2, classes=4)          residual MLP with a `blocks` ModuleList
    failing_model(dim=16, classes=4)                 a model whose forward always raises: no trial can train
    slow_items(split, n=512, dim=16, delay=0.005)    in-memory tensors, but every __getitem__ sleeps `delay`
                                                     s: a slow, host-bound loader that workers overlap (a
                                                     sleep is wall time, so it overlaps on a loaded 2-core CPU)
"""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class ResMLP(nn.Module):
    def __init__(self, dim: int, depth: int, classes: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def build_model(dim: int = 16, depth: int = 2, classes: int = 4) -> nn.Module:
    return ResMLP(dim, depth, classes)


class Failing(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("failing_model: this forward always raises")


def failing_model(dim: int = 16, classes: int = 4) -> nn.Module:
    return Failing(dim, classes)


class SlowItems(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, delay: float):
        self.x, self.y, self.delay = x, y, delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def slow_items(split: str, n: int = 512, dim: int = 16, classes: int = 4, delay: float = 0.005) -> SlowItems:
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    x = torch.randn(n, dim, generator=g)
    return SlowItems(x, (x[:, :classes].argmax(1)), delay)

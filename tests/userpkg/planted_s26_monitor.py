"""Planted faults for tests/faults/test_planted_s26_monitor.py, on fault.toml's linear regression.

    stuck_forward(dim=8, after=6, sleep_s=600.0)  linear whose forward blocks (sleeps `sleep_s`) from its
                                                  `after`-th training call on: a hang in the step, not the data
"""
from __future__ import annotations

import math
import time

import torch
from torch import nn
from userpkg.data import regression
from userpkg.models import Linear
from userpkg.regression import Regression


class StuckForward(Linear):
    def __init__(self, dim: int, after: int, sleep_s: float):
        super().__init__(dim)
        self.after, self.sleep_s, self.calls = after, sleep_s, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls > self.after:  # a collective whose peer is gone, a kernel that never returns
                time.sleep(self.sleep_s)
        return super().forward(x)


def stuck_forward(dim: int = 8, after: int = 6, sleep_s: float = 600.0) -> nn.Module:
    return StuckForward(dim, after, sleep_s)


class NanFrom(Regression):
    """Regression whose reads from the `at`-th batch of 8 on hold NaN inputs: a corrupt shard mid-run."""

    def __init__(self, ds: Regression, at: int):
        super().__init__(ds.x, ds.y)
        self.at, self.reads = at, 0

    def __getitem__(self, i: int):
        self.reads += 1
        x, y = super().__getitem__(i)
        return (x * math.nan, y) if (self.reads - 1) // 8 + 1 >= self.at else (x, y)


def nan_from(split: str, at: int = 15, n: int = 64, dim: int = 8) -> Regression:
    ds = regression(split, n, dim)
    return NanFrom(ds, at) if split == "train" else ds

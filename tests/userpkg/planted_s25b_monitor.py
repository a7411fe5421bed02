"""Planted faults for tests/faults/test_planted_s25b_monitor.py, on fault.toml's linear regression.

    slow_reads(split, after=16, sleep_s=0.02, n=64, dim=8)  regression whose reads after the `after`-th batch of 8
                                                            sleep `sleep_s` each: a data source that slows mid-run
    spike_once(split, at=20, scale=30.0, n=64, dim=8)       regression whose `at`-th batch of 8 read has its targets
                                                            scaled by `scale` (one bad batch), the others clean
    nan_branch(dim=8)                                       linear + a where() branch the loss never takes: a finite
                                                            loss over a NaN gradient
    Leak                                                    a callback that keeps 4 MiB of tensors every step
"""
from __future__ import annotations

import time

import torch
from torch import nn
from userpkg.data import regression
from userpkg.models import Linear
from userpkg.regression import Regression


class _Counted(Regression):
    def __init__(self, ds: Regression):
        super().__init__(ds.x, ds.y)
        self.reads = 0

    def batch_index(self) -> int:
        self.reads += 1
        return (self.reads - 1) // 8 + 1  # the batch of 8 this read belongs to, in reading order


class SlowReads(_Counted):
    def __init__(self, ds: Regression, after: int, sleep_s: float):
        super().__init__(ds)
        self.after, self.sleep_s = after, sleep_s

    def __getitem__(self, i: int):
        if self.batch_index() > self.after:
            time.sleep(self.sleep_s)
        return super().__getitem__(i)


def slow_reads(split: str, after: int = 16, sleep_s: float = 0.02, n: int = 64, dim: int = 8) -> Regression:
    ds = regression(split, n, dim)
    return SlowReads(ds, after, sleep_s) if split == "train" else ds


class SpikeOnce(_Counted):
    def __init__(self, ds: Regression, at: int, scale: float):
        super().__init__(ds)
        self.at, self.scale = at, scale

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return (x, y * self.scale) if self.batch_index() == self.at else (x, y)


def spike_once(split: str, at: int = 20, scale: float = 30.0, n: int = 64, dim: int = 8) -> Regression:
    ds = regression(split, n, dim)
    return SpikeOnce(ds, at, scale) if split == "train" else ds


class NanBranch(Linear):
    def __init__(self, dim: int):
        super().__init__(dim)
        self.gate = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a branch that is never taken: the loss is finite, yet sqrt'(-1) * 0 is NaN in the gate's gradient
        z = x * 0 - 1 + self.gate
        return super().forward(x) + torch.where(z > 0, torch.sqrt(z), torch.zeros_like(z)).sum(-1)


def nan_branch(dim: int = 8) -> nn.Module:
    return NanBranch(dim)


class Leak:
    """Keeps 40 MiB of fresh tensors every step (a list of losses kept as tensors, at scale). Past glibc's largest
    mmap threshold (32 MiB) each is fresh memory, so the RSS grows: a smaller block may be served from heap pages a
    long-lived test process freed earlier and the RSS would not move."""

    def __init__(self):
        self.kept: list[torch.Tensor] = []

    def on_step_end(self, state):
        self.kept.append(torch.ones(10 << 20))


class SlowRank(Regression):
    def __init__(self, ds: Regression, sleep_s: float):
        super().__init__(ds.x, ds.y)
        self.sleep_s = sleep_s

    def __getitem__(self, i: int):
        time.sleep(self.sleep_s)
        return super().__getitem__(i)


def slow_rank(split: str, rank: int = 1, sleep_s: float = 0.005, n: int = 64, dim: int = 8) -> Regression:
    """regression whose reads on rank `rank` (of torchrun's RANK) sleep `sleep_s` each: a straggler's slow disk."""
    import os

    ds = regression(split, n, dim)
    return SlowRank(ds, sleep_s) if split == "train" and int(os.environ.get("RANK", "0")) == rank else ds


class DeadRelu(Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # every unit below 0: relu's gradient is 0 everywhere, the loss stays where it started
        return torch.relu(self.fc(x) - 1e4).squeeze(-1)


def dead_relu(dim: int = 8) -> nn.Module:
    return DeadRelu(dim)

"""Data factories for tests/faults/test_redteam_s23_data.py: datasets that break the data contract in ways
turbotrain must name (one `error:` line), never train through silently.

    data.name = "userpkg.redteam_s23_data:<factory>", with userpkg.models:linear (dim 8) and loss "mse"
"""
from __future__ import annotations

import os
import signal
import sys

import numpy as np
import torch
from torch.utils.data import Dataset


class Pairs(Dataset):
    """64 items of (x (8,), y ()); `mode` picks how item `at` and later ones break."""

    def __init__(self, mode: str = "", at: int = 20, n: int = 64, length: int | None = None):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randn(n, generator=g)
        self.mode, self.at, self.length = mode, at, length

    def __len__(self):
        return len(self.x) if self.length is None else self.length

    def __getitem__(self, i):
        m = self.mode
        if i == self.at and m == "stop":
            raise StopIteration  # e.g. next() on an exhausted iterator inside __getitem__
        if i == self.at and m == "exit":
            sys.exit(3)
        if i == self.at and m == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.at and m == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if m == "numpy":
            return self.x[i].numpy(), self.y[i].numpy()
        if m == "grad_later" and i >= self.at:
            return self.x[i].clone().requires_grad_(), self.y[i]
        if m == "nan_x" and i >= self.at:
            return torch.full((8,), float("nan")), self.y[i]
        if m == "pyfloat":
            return self.x[i], float(self.y[i])
        if m == "triple":
            return self.x[i], self.y[i], self.y[i]
        return self.x[i], self.y[i]


def pairs(split: str, **args) -> Pairs:
    return Pairs(**args)


class FloatLen(Pairs):
    def __len__(self):
        return 64.0


def float_len(split: str) -> FloatLen:
    return FloatLen()


class NpLen(Pairs):
    def __len__(self):
        return np.int64(64)


def np_len(split: str) -> NpLen:
    return NpLen()


def val_none(split: str):
    """A factory that forgot the val split (falls off the end of an if)."""
    if split == "train":
        return Pairs()

"""Data factories, good and bad, for the fault tests.

    regression(split, n=64, dim=8)   a working map-style Dataset of (x (dim,), y ()) float pairs
    returns_none(split, **args)      returns None, not a Dataset
    iterable(split, **args)          an IterableDataset (no __getitem__ / __len__)
"""
from __future__ import annotations

import torch
from torch.utils.data import IterableDataset
from userpkg.regression import Regression


def regression(split: str, n: int = 64, dim: int = 8) -> Regression:
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, generator=torch.Generator().manual_seed(7))
    return Regression(x, x @ w)


def returns_none(split: str, **args):
    return None


class Stream(IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(8, generator=g), torch.randn((), generator=g)


def iterable(split: str, **args) -> Stream:
    return Stream()

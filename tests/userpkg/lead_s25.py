"""Plants for tests/faults/test_lead_s25.py.

    nan_rows(split, n=64, dim=8, bad=3)   userpkg.data:regression whose item `bad` holds NaN inputs (a bad row in
                                          the data: the same item whenever it is read)
"""
from __future__ import annotations

from userpkg.data import regression
from userpkg.regression import Regression


def nan_rows(split: str, n: int = 64, dim: int = 8, bad: int = 3) -> Regression:
    ds = regression(split, n, dim)
    if split == "train":
        ds.x[bad] = float("nan")
    return ds

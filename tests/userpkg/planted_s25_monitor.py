"""Planted faults for tests/faults/test_planted_s25_monitor.py (HangAt3: a callback whose step 3 never ends).

    nan_batch(split, at=2, n=64, dim=8)   userpkg.data:regression whose `at`-th batch of 8 read (in reading order,
                                          whatever the shuffle) holds NaN inputs; the others are clean
"""
from __future__ import annotations

from userpkg.data import regression
from userpkg.regression import Regression


class NanBatch(Regression):
    def __init__(self, ds: Regression, at: int):
        super().__init__(ds.x, ds.y)
        self.at, self.reads = at, 0

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        self.reads += 1
        return (x * float("nan"), y) if (self.reads - 1) // 8 == self.at - 1 else (x, y)


def nan_batch(split: str, at: int = 2, n: int = 64, dim: int = 8) -> Regression:
    ds = regression(split, n, dim)
    return NanBatch(ds, at) if split == "train" else ds


class HangAt3:
    """A callback whose step 3 never ends (a collective a dead peer never joins): the watchdog's plant."""

    def on_step_end(self, state):
        if state.step == 3:
            import time
            time.sleep(3600)

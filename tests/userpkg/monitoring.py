"""Planted faults for the monitoring tests: data that turns slow half-way, data that blocks forever.

    slow_after(split, n=64, dim=8, after=160, delay=0.003)   regression items; each item after the first
                                                             `after` sleeps `delay` s (the loader turns slow)
    blocks_at(split, n=64, dim=8, after=24, rank=-1)         regression items; item number `after` never
                                                             returns (on every rank, or on `rank` only)
"""
from __future__ import annotations

import os
import threading
import time

from userpkg.data import Regression, regression


class SlowAfter(Regression):
    def __init__(self, base: Regression, after: int, delay: float):
        super().__init__(base.x, base.y)
        self.after, self.delay, self.calls = after, delay, 0

    def __getitem__(self, i: int):
        self.calls += 1
        if self.calls > self.after:
            time.sleep(self.delay)
        return super().__getitem__(i)


def slow_after(split: str, n: int = 64, dim: int = 8, after: int = 160, delay: float = 0.003) -> Regression:
    base = regression(split, n, dim)
    return SlowAfter(base, after, delay) if split == "train" else base


class BlocksAt(Regression):
    def __init__(self, base: Regression, after: int, rank: int):
        super().__init__(base.x, base.y)
        self.after, self.calls = after, 0
        self.blocks = rank < 0 or int(os.environ.get("RANK", "0")) == rank

    def __getitem__(self, i: int):
        self.calls += 1
        if self.blocks and self.calls > self.after:
            threading.Event().wait()  # forever: a stuck network filesystem, a dead data server
        return super().__getitem__(i)


def blocks_at(split: str, n: int = 64, dim: int = 8, after: int = 24, rank: int = -1) -> Regression:
    base = regression(split, n, dim)
    return BlocksAt(base, after, rank) if split == "train" else base

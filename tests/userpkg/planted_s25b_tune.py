"""Planted workloads for `turbotrain tune`, second pass (tests/faults/test_planted_s25b_tune.py, and by hand).

    sleepy(dim=8, classes=4, delay=0.02)   a linear model whose forward sleeps `delay` s: the step is the sleep,
                                           so no speed lever can win (tune must keep the input config)
"""
from __future__ import annotations

import time

import torch
from torch import nn


class Sleepy(nn.Linear):
    def __init__(self, dim: int, classes: int, delay: float):
        super().__init__(dim, classes)
        self.delay = delay

    @torch.compiler.disable
    def _wait(self) -> None:
        time.sleep(self.delay)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._wait()
        return super().forward(x)


def sleepy(dim: int = 8, classes: int = 4, delay: float = 0.02) -> nn.Module:
    return Sleepy(dim, classes, delay)

"""A workload whose rank 1 is slow to load data: the straggler test's planted fault."""
import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset


class SlowOnRank1(Dataset):
    """Rank 1 sleeps `delay` s per item: 25 ms x 4 items = 100 ms a step of its own time, which a loaded CPU
    cannot hide behind rank 0's forward of a tiny MLP (a sleep is wall time whatever the load)."""

    def __init__(self, n: int = 256, delay: float = 0.025):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)
        self.delay = delay if os.environ.get("RANK") == "1" else 0.0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def build_data(split, delay: float = 0.025):
    return SlowOnRank1(delay=delay)


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

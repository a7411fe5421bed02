"""A workload whose rank 1 is slow to load data: the straggler test's planted fault."""
import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset


class SlowOnRank1(Dataset):
    def __init__(self, n: int = 256):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)
        self.delay = 0.01 if os.environ.get("RANK") == "1" else 0.0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


def build_data(split):
    return SlowOnRank1()


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

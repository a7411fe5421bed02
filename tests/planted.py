"""Planted workloads for the profiler's verdict tests."""
import time

import torch
from torch import nn
from torch.utils.data import Dataset


class SlowItems(Dataset):
    """Each item takes 4 ms to produce (decoding, augmentation...): a data-bound workload."""

    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(0.004)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), int(i % 4)


def slow_data(split):
    return SlowItems()


def small_model():
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def heavy_model():
    """Compute-heavy: a few wide layers on 32 inputs."""
    return nn.Sequential(nn.Linear(32, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 4))

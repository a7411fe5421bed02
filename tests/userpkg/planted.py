"""Planted workloads for the profiler's verdict tests."""
import time

import torch
from torch import nn
from torch.utils.data import Dataset


class SlowItems(Dataset):
    """Each item takes `delay` s to produce (decoding, augmentation...): a data-bound workload. A sleep is wall
    time whatever the machine's load, and 20 ms x 16 items = 320 ms a step dwarfs the tiny model's step even when
    a loaded CPU makes that 100x slower (4 ms items gave a data-wait share of only 0.39 on a loaded machine)."""

    def __init__(self, delay: float = 0.02):
        self.delay = delay

    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(self.delay)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), int(i % 4)


def slow_data(split, delay: float = 0.02):
    return SlowItems(delay)


def small_model():
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def heavy_model():
    """Compute-heavy: a few wide layers on 32 inputs."""
    return nn.Sequential(nn.Linear(32, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 4))

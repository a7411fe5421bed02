"""Planted workloads whose bottleneck or loss curve is known in advance, for the end-to-end verdict tests
(tests/faults/test_planted_s22.py): profile verdicts, monitor alerts, tune's data-loader fix."""
import time

import torch
from torch import nn
from torch.utils.data import Dataset


class Items(Dataset):
    """32-feature vectors with 4 classes; `delay` s of sleep per item (a slow decode): data-bound."""

    def __init__(self, n: int = 256, delay: float = 0.0):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), int(i % 4)


def items(split, n: int = 256, delay: float = 0.0):
    return Items(n, delay)


class Regression(Dataset):
    """y = x @ w (learnable). Bad items by the order they are read (num_workers = 0 reads a batch's items in
    one go, whatever the shuffle): from the `spike_from`-th read on, `spike_n` items get targets `spike` times
    larger (bad labels: that batch's loss is far above the running average); from the `nan_from`-th read on,
    every target is NaN."""

    def __init__(self, n=64, spike_from=-1, spike_n=8, spike=1e3, nan_from=-1):
        self.n, self.spike_from, self.spike_n, self.spike, self.nan_from = n, spike_from, spike_n, spike, nan_from
        self.w = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))
        self.reads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        y = x @ self.w
        k, self.reads = self.reads, self.reads + 1
        if 0 <= self.spike_from <= k < self.spike_from + self.spike_n:
            y = y * self.spike
        if 0 <= self.nan_from <= k:
            y = y * float("nan")
        return x, y


def regression(split, **bad):
    """The training split carries the planted items; the validation split is clean."""
    return Regression(**bad) if split == "train" else Regression(n=bad.get("n", 64))


class Noise(Dataset):
    """Targets independent of the inputs: nothing to learn, the loss stays flat (a plateau)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.randn(1, generator=g)


def noise(split):
    return Noise()


def linear(dim: int = 8):
    return nn.Linear(dim, 1)


class ManyTiny(nn.Module):
    """A small forward beside 2000 tiny parameters, all read in one op (each gets a gradient, or the
    optimizer would skip it): every step the optimizer walks all of them, so it dwarfs forward and backward."""

    def __init__(self, n: int = 2000):
        super().__init__()
        self.net = nn.Linear(32, 4)
        self.tiny = nn.ParameterList(nn.Parameter(torch.zeros(4)) for _ in range(n))

    def forward(self, x):
        return self.net(x) + torch.stack(list(self.tiny)).sum() * 0


def many_tiny(n: int = 2000):
    return ManyTiny(n)


def heavy(width: int = 1024):
    """Compute-heavy: wide layers on 32 inputs, nothing else in the step."""
    return nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 4))


class HostWork(nn.Module):
    """A forward that does host work outside torch ops (a Python-side lookup, a sleep) around a tiny layer."""

    def __init__(self, delay: float = 0.05):
        super().__init__()
        self.net, self.delay = nn.Linear(32, 4), delay

    def forward(self, x):
        time.sleep(self.delay)
        return self.net(x)


def host_work(delay: float = 0.05):
    return HostWork(delay)


def small():
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


class SleepyCallback:
    """A callback that sleeps at every step's end (a slow logger, a synchronous upload)."""

    def __init__(self, delay: float = 0.05):
        self.delay = delay

    def on_step_end(self, state):
        time.sleep(self.delay)


def sleepy_callback(delay: float = 0.05):
    return SleepyCallback(delay)


class SlowAdamW(torch.optim.AdamW):
    """AdamW whose every step also takes `delay` s of host time (an optimizer doing host-side bookkeeping)."""

    delay = 0.05

    def step(self, closure=None):
        time.sleep(self.delay)
        return super().step(closure)


def slow_adamw(param_groups, lr, weight_decay):
    return SlowAdamW(param_groups, lr=lr, weight_decay=weight_decay)

"""Planted workloads for `profile`'s second pass (tests/faults/test_planted_s25b_profile.py): a slow loss, a
Python per-parameter optimizer, numpy/list items, a per-step RNG reseed, a graph break, and healthy shapes."""

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset


def slow_loss(out, y):
    """Cross-entropy one sample at a time: a Python loop over the batch, `reps` times over (a per-sample loss)."""
    total = out.new_zeros(())
    for _ in range(8):
        for i in range(out.shape[0]):
            total = total + nn.functional.cross_entropy(out[i:i + 1], y[i:i + 1])
    return total / (8 * out.shape[0])


class PySGD(torch.optim.Optimizer):
    """SGD with momentum written as Python per parameter, per element group: one small op at a time."""

    def __init__(self, params, lr=0.01):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("m", torch.zeros_like(p))
                for row in range(p.shape[0]):  # per row: a Python loop over the tensor's slices
                    buf[row].mul_(0.9).add_(p.grad[row])
                    p[row].add_(buf[row], alpha=-g["lr"])


def py_sgd(param_groups, lr, weight_decay):
    return PySGD(param_groups, lr=lr)


def wide(width: int = 256):
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 4))


class Arrays(Dataset):
    """Items as numpy arrays (`kind="numpy"`) or Python lists (`kind="list"`) of `dim` floats."""

    def __init__(self, kind: str = "numpy", dim: int = 32, n: int = 256):
        self.kind, self.dim, self.n = kind, dim, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = np.random.default_rng(i).standard_normal(self.dim).astype(np.float32)
        return (x if self.kind == "numpy" else x.tolist()), int(i % 4)


def arrays(split, kind: str = "numpy", dim: int = 32, n: int = 256):
    return Arrays(kind, dim, n)


class Reseeded(nn.Module):
    """A model that reseeds the global RNG in each forward (a reproducibility habit): no stall."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.net = wide(width)

    def forward(self, x):
        torch.manual_seed(0)
        return self.net(nn.functional.dropout(x, 0.1, self.training))


def reseeded(width: int = 256):
    return Reseeded(width)


class Chatty(nn.Module):
    """A forward with a print and a value-dependent Python branch: each a graph break under torch.compile."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = self.a(x)
        print("debug", end="")
        if h.mean() > 0:
            h = h * 2
        return self.b(torch.relu(h))


def chatty():
    return Chatty()


def fat(width: int = 2048):
    """A 4M-weight gradient behind almost no compute (8 samples): under DDP each step all-reduces 16 MB."""
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.Linear(width, 4))

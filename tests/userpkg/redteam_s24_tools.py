"""Planted workloads for the measuring tools' red-team tests (tests/faults/test_redteam_s24_tools.py)."""
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class Batched(Dataset):
    """32-feature vectors, 4 classes; `__getitems__` (what the loader calls per batch, before collation) sleeps
    `delay` s: host work in the loader's batching, not in the model."""

    def __init__(self, n: int = 256, delay: float = 0.0):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), int(i % 4)

    def __getitems__(self, idx):
        time.sleep(self.delay)
        return [self[i] for i in idx]


def batched(split, n: int = 256, delay: float = 0.05):
    return Batched(n, delay)


class Decode(Dataset):
    """Items decoded by a Python loop (CPU work, not a sleep): `work` iterations each."""

    def __init__(self, n: int = 256, work: int = 20000):
        self.n, self.work = n, work

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        acc = 0
        for k in range(self.work):
            acc = (acc * 31 + k) % 1000003
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g) + acc * 0, int(i % 4)


def decode(split, n: int = 256, work: int = 20000):
    return Decode(n, work)


class ItemForward(nn.Module):
    """A small layer whose forward reads values back (`.item()` per sample)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(32, 4)

    def forward(self, x):
        h = self.net(x)
        self.seen = [float(v.sum().item()) for v in h]
        return h


class PrintForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(32, 4)

    def forward(self, x):
        h = self.net(x)
        print(h)
        return h


class CpuForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(32, 4)

    def forward(self, x):
        h = self.net(x)
        self.kept = [v.detach().cpu() for v in h]
        return h


def item_forward():
    return ItemForward()


def print_forward():
    return PrintForward()


def cpu_forward():
    return CpuForward()


def f64_loss(out, y):
    return F.cross_entropy(out.double(), y)


class BigEmbedding(nn.Module):
    """A huge embedding table read at one row a sample, a tiny body: the optimizer walks the whole table."""

    def __init__(self, rows: int = 200_000, dim: int = 16):
        super().__init__()
        self.emb, self.head = nn.Embedding(rows, dim), nn.Linear(dim, 4)

    def forward(self, x):
        idx = (x[:, 0].abs() * 1000).long() % self.emb.num_embeddings
        return self.head(self.emb(idx))


def big_embedding(rows: int = 200_000, dim: int = 16):
    return BigEmbedding(rows, dim)


def many_layers(n: int = 60, width: int = 8):
    layers = [nn.Linear(32, width)] + [m for _ in range(n) for m in (nn.Linear(width, width), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(width, 4))


class SyncCallback:
    """A callback that sleeps at every step end (a synchronous upload)."""

    def on_step_end(self, state):
        time.sleep(0.05)


class Wide(nn.Module):
    """A 32 → 512-class layer: its logits (and a float64 loss over them) are the bulk of the step."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(32, 512)

    def forward(self, x):
        return self.net(x)


def wide():
    return Wide()


def classes(split, n: int = 256):
    """32-feature vectors with 512 classes, in memory."""
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 512, (n,), generator=g))


class Ballast(nn.Module):
    """A tiny layer beside a 64 MB buffer: nothing to train, everything to save (a checkpoint costs far more
    than a step)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(32, 4)
        self.register_buffer("table", torch.randn(16_000_000))

    def forward(self, x):
        return self.net(x)


def ballast():
    return Ballast()


class WritingCallback:
    """Opens a file in the run's folder at the start, then sleeps and writes to it at every step end (what a
    synchronous logger does)."""

    def on_train_start(self, state):
        self.log = state.run_dir / "callback-was-here.txt"

    def on_step_end(self, state):
        time.sleep(0.1)
        self.log.write_text(str(state.step))

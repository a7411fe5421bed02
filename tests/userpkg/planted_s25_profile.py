"""Planted workloads for `profile`'s verdicts (tests/faults/test_planted_s25_profile.py): host syncs of every
kind in forward, heavy per-item transforms, float64 parameters, a giant embedding, a sleeping loader."""

import os
import signal

import torch
from torch import nn
from torch.utils.data import Dataset


class Synced(nn.Module):
    """A small MLP whose forward reads its activations back `how` (a debug print, a mask, a count) `n` times:
    on a GPU each is a host sync; the arithmetic is the same."""

    def __init__(self, how: str = "item", n: int = 8, width: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 4))
        self.how, self.n = how, n

    def forward(self, x):
        h = self.net[0](x)
        for _ in range(self.n):
            if self.how == "item":
                h = h + h.mean().item() * 0
            elif self.how == "nonzero":
                h = h + torch.nonzero(h > 0).shape[0] * 0
            elif self.how == "mask":
                h = h + h[h > 0].sum() * 0
            elif self.how == "if":
                if h.sum() > -1e30:
                    h = h + 0
        return self.net[2](self.net[1](h))


def synced(how: str = "item", n: int = 8, width: int = 32):
    return Synced(how, n, width)


class Transformed(Dataset):
    """Items built by a heavy CPU transform (a large FFT per item): data-bound with no workers."""

    def __init__(self, size: int = 256):
        self.size = size

    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.randn(self.size, self.size, generator=g)
        for _ in range(4):  # an augmentation pipeline: blur in the frequency domain
            img = torch.fft.ifft2(torch.fft.fft2(img) * 0.5).real
        return img[0, :32].contiguous(), int(i % 4)


def transformed(split, size: int = 256):
    return Transformed(size)


class Doubled(nn.Module):
    """float64 parameters, the batch cast to float64 on the way in: every op of the step in float64."""

    def __init__(self, width: int = 512):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, 4)).double()

    def forward(self, x):
        return self.net(x.double()).float()


def doubled(width: int = 512):
    return Doubled(width)


class GiantEmbedding(nn.Module):
    """A 2M x 16 embedding table (32M weights, dense gradients) read by 8 rows a sample: the optimizer updates
    the whole table every step for a handful of looked-up rows."""

    def __init__(self, rows: int = 2_000_000):
        super().__init__()
        self.emb, self.head = nn.Embedding(rows, 16), nn.Linear(16, 4)
        self.rows = rows

    def forward(self, x):
        idx = (x[:, :8].abs() * 1000).long() % self.rows
        return self.head(self.emb(idx).mean(1))


def giant_embedding(rows: int = 2_000_000):
    return GiantEmbedding(rows)


def heavy_ok(width: int = 768):
    """A healthy compute-heavy MLP: no stall planted."""
    return nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 4))


class TermAtThirdStep:
    """Writes into its run_dir (profile's scratch folder) at each step end, and at the third sends this process
    SIGTERM, as a scheduler stopping the job does: deterministic, whatever the machine's speed."""

    def on_train_start(self, state):
        self.log, self.steps = state.run_dir / "callback-was-here.txt", 0

    def on_step_end(self, state):
        self.steps += 1
        self.log.write_text(str(self.steps))
        if self.steps == 3:
            os.kill(os.getpid(), signal.SIGTERM)

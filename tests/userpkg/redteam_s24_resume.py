"""User code for tests/faults/test_redteam_s24_resume.py: datasets and callbacks that draw from the global RNGs
(random augmentation in __getitem__, a hook that samples), as real training scripts do."""
from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset


class Augmented(Dataset):
    """userpkg.data:regression with noise drawn per item from torch's, numpy's and Python's global RNGs."""

    def __init__(self, split: str, n: int, dim: int):
        g = torch.Generator().manual_seed(0 if split == "train" else 1)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x @ torch.randn(dim, generator=torch.Generator().manual_seed(7))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = 0.1 * torch.randn(self.x.shape[1]) + float(np.random.rand()) + random.random()
        return self.x[i] + noise, self.y[i]


def augmented(split: str, n: int = 64, dim: int = 8) -> Augmented:
    return Augmented(split, n, dim)


class Dropped(nn.Module):
    """userpkg.models:linear behind dropout: each training step draws a mask from torch's global RNG."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.drop, self.fc = nn.Dropout(0.5), nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(x)).squeeze(-1)


def dropped(dim: int = 8) -> Dropped:
    return Dropped(dim)


class SampleAtCheckpoint:
    """Draws from the global RNGs once a checkpoint is written (a sample of the model's output, say)."""

    def on_checkpoint(self, state, path):
        torch.rand(3), np.random.rand(), random.random()


class SampleAtStart:
    """Draws from the global RNGs as the run starts (picking the prompts it will sample from, say)."""

    def on_train_start(self, state):
        torch.rand(3), np.random.rand(), random.random()


class GroupTerm(Augmented):
    """In a loader worker, its 30th read sends SIGTERM to the training process and to the worker itself: what a
    scheduler's SIGTERM to the whole process group (SLURM's scancel, systemd's stop) does while a batch is read.
    Its reads are slow, so the training process is waiting for that batch by then."""

    reads = 0

    def __getitem__(self, i):
        import os
        import signal
        import time

        if torch.utils.data.get_worker_info() is not None:
            self.reads += 1
            time.sleep(0.01)
            if self.reads == 30:
                os.kill(os.getppid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
        return super().__getitem__(i)


def group_term(split: str, n: int = 64, dim: int = 8) -> GroupTerm:
    return GroupTerm(split, n, dim)


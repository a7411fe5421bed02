"""User code for tests/faults/test_redteam_s23_api.py: what a notebook passes to turbotrain.train() run after
run in one process."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset

from turbotrain.callbacks import Callback


class Pairs(Dataset):
    """64 (inputs (8,), target) pairs: the shape userpkg.models:linear takes."""

    def __init__(self, n: int = 64):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class FailAtStep2(Callback):
    """The user's own code failing mid-run: the run ends, the notebook goes on."""

    def on_step_end(self, state):
        if state.step == 2:
            raise RuntimeError("a bug in the user's callback")


class Hidden(torch.nn.Module):
    """inputs (B, 8) → (B,) through a hidden layer of `width`: models of other widths are other graphs to dynamo."""

    def __init__(self, width: int):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, width), torch.nn.Linear(width, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).squeeze(-1)

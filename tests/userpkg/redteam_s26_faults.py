"""User code for tests/faults/test_redteam_s26_faults.py: a callback and a dataset that send this process a signal
at a chosen moment (as a scheduler's SIGTERM lands there), and the pieces the fault cases around a run need."""
from __future__ import annotations

import os
import signal

import torch
from torch.utils.data import Dataset


class SignalAt:
    """Sends `signum` to this process from inside `hook` at `step` (on_train_start: the start step)."""

    def __init__(self, hook: str, step: int = 0, signum: int = signal.SIGTERM):
        self.hook, self.step, self.signum, self.sent = hook, step, signum, 0
        setattr(self, hook, self._fire)

    def _fire(self, state, *args) -> None:
        if state.step == self.step and not self.sent:
            self.sent += 1
            os.kill(os.getpid(), self.signum)


class SignalOnRead(Dataset):
    """userpkg.data:regression whose reads send SIGTERM once armed (by `Arm` at on_train_start): the signal lands
    inside the training loop's read of the first step's batch (data.num_workers = 0)."""

    def __init__(self, n: int = 64, dim: int = 8):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x @ torch.randn(dim, generator=torch.Generator().manual_seed(7))
        self.armed, self.sent = False, 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.armed and not self.sent:
            self.sent += 1
            os.kill(os.getpid(), signal.SIGTERM)
        return self.x[i], self.y[i]


class Arm:
    def __init__(self, data: SignalOnRead):
        self.data = data

    def on_train_start(self, state) -> None:
        self.data.armed = True


class FailOnCheckpoint:
    """A callback whose on_checkpoint fails for the checkpoint of `step` (an upload to a store that is down, say)."""

    def __init__(self, step: int):
        self.step = step

    def on_checkpoint(self, state, path) -> None:
        if state.step == self.step:
            raise RuntimeError("the upload failed")

"""Planted gradient and memory faults for tests/faults/test_redteam_s23_monitor.py: models whose gradients die,
are dead from the start or blow up at a known training step, and one that leaks memory every step. Each plant
counts its own training forwards (evaluation runs under no_grad and is not counted), so the step is fixed."""
import torch
from torch import nn


class DiesAt(nn.Module):
    """A ReLU net (no output bias) whose hidden units all die from the `at`-th training forward on: every
    gradient is 0 from then, the loss stays where it was (a vanishing gradient, nothing trains)."""

    def __init__(self, at: int = 6, dim: int = 8):
        super().__init__()
        self.at, self.calls = at, 0
        self.inp, self.out = nn.Linear(dim, 16), nn.Linear(16, 1, bias=False)

    def forward(self, x):
        if torch.is_grad_enabled():
            self.calls += 1
        h = self.inp(x) - (1e6 if self.calls >= self.at else 0.0)
        return self.out(torch.relu(h))


def dies_at(at: int = 6, dim: int = 8):
    return DiesAt(at, dim)


class Detached(nn.Module):
    """The prediction does not depend on the weights (a detached output): every gradient is 0 from step 1."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.net = nn.Linear(dim, 1)

    def forward(self, x):
        return self.net(x).detach() + 0 * self.net.bias


def detached(dim: int = 8):
    return Detached(dim)


class GradBlowsUpAt(nn.Module):
    """At the `at`-th training forward the gradient reaching the weights is `factor` times what it is (a hook
    on the output): the loss of that step is the usual one, only the gradient norm explodes."""

    def __init__(self, at: int = 8, factor: float = 1e4, dim: int = 8):
        super().__init__()
        self.at, self.factor, self.calls = at, factor, 0
        self.net = nn.Linear(dim, 1)

    def forward(self, x):
        y = self.net(x)
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.at:
                y.register_hook(lambda g: g * self.factor)
        return y


def grad_blows_up_at(at: int = 8, factor: float = 1e4, dim: int = 8):
    return GradBlowsUpAt(at, factor, dim)


class Leaks(nn.Module):
    """Keeps `mib` MiB of fresh memory (written: resident) from every training forward: a leak."""

    def __init__(self, mib: int = 16, dim: int = 8):
        super().__init__()
        self.mib, self.kept = mib, []
        self.net = nn.Linear(dim, 1)

    def forward(self, x):
        if torch.is_grad_enabled():
            self.kept.append(torch.ones(self.mib * 2**18))  # float32: 4 bytes each, every page written
        return self.net(x)


def leaks(mib: int = 16, dim: int = 8):
    return Leaks(mib, dim)

"""Planted workloads for `profile`'s third pass (tests/faults/test_planted_s26_profile.py): a forward that exports
tensor values to the host (.tolist(), .numpy()), a forward dominated by one slow layer, a callback whose on_log
is slow, and a model that fails after the warm-up."""
import time

import torch
from torch import nn


class Exports(nn.Module):
    """A small MLP whose forward copies its hidden activations to the host `n` times a step (`how`: "tolist" or
    "numpy") and looks at them in Python: a host read on a GPU, a Python round trip anywhere."""

    def __init__(self, how: str = "tolist", n: int = 20):
        super().__init__()
        self.a, self.b, self.how, self.n = nn.Linear(32, 64), nn.Linear(64, 4), how, n

    def forward(self, x):
        h = torch.relu(self.a(x))
        for _ in range(self.n):  # each copy is read whole in Python: host work around one export op
            vals = h.tolist() if self.how == "tolist" else h.detach().numpy().tolist()
            if max(max(r) for r in vals) < -1e9:  # never true: the values are only looked at
                h = h * 2
        return self.b(h)


def exports(how: str = "tolist", n: int = 20):
    return Exports(how, n)


class OneSlowLayer(nn.Module):
    """Small layers around one convolution over a large image (`size` x `size`, 64 channels): forward's time
    is nearly all in `slow`, with few parameters for the optimizer."""

    def __init__(self, size: int = 64):
        super().__init__()
        self.size = size
        self.inp = nn.Linear(32, 16)
        self.slow = nn.Conv2d(16, 64, 5, padding=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.out = nn.Linear(64, 4)

    def forward(self, x):
        h = self.inp(x)[:, :, None, None].expand(-1, -1, self.size, self.size)
        return self.out(self.pool(self.slow(h)).flatten(1))


def one_slow_layer(size: int = 64):
    return OneSlowLayer(size)


class SlowLog:
    """A callback whose on_log takes `delay` s (a synchronous upload of each logged row)."""

    def __init__(self, delay: float = 0.05):
        self.delay = delay

    def on_log(self, state):
        time.sleep(self.delay)


def slow_log(delay: float = 0.05):
    return SlowLog(delay)


class FailsLater(nn.Module):
    """Trains for `ok` forwards, then raises (a shape bug reached only by a later batch)."""

    def __init__(self, ok: int = 2):
        super().__init__()
        self.net, self.ok, self.calls = nn.Linear(32, 4), ok, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > self.ok:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x31 and 32x4)")
        return self.net(x)


def fails_later(ok: int = 2):
    return FailsLater(ok)


def even_layers(width: int = 256):
    """Four equal layers: forward's time spread evenly, no layer to name."""
    return nn.Sequential(nn.Linear(32, width), *(nn.Linear(width, width) for _ in range(3)), nn.Linear(width, 4))


class NestedSlow(nn.Module):
    """The slow convolution one level down, inside a container that does nothing itself."""

    def __init__(self, size: int = 96):
        super().__init__()
        self.body = OneSlowLayer(size)

    def forward(self, x):
        return self.body(x)


def nested_slow(size: int = 96):
    return NestedSlow(size)


def slow_log_half():
    """SlowLog of 0.5 s: ~100x a small model's step."""
    return SlowLog(0.5)


class SharedBlock(nn.Module):
    """One wide layer applied 8 times a forward (a weight-shared block) beside a single call of another as wide:
    the shared one holds 8/9 of forward's time, though no single call of it is larger than the other's."""

    def __init__(self, width: int = 512):
        super().__init__()
        self.inp, self.shared, self.once = nn.Linear(32, width), nn.Linear(width, width), nn.Linear(width, width)
        self.out = nn.Linear(width, 4)

    def forward(self, x):
        h = self.once(self.inp(x))
        for _ in range(8):
            h = self.shared(h)
        return self.out(h)


def shared_block(width: int = 512):
    return SharedBlock(width)


class ReadsWeights:
    """A callback that reads each parameter's norm as a Python float at every step's end (a per-step weight
    logger): one host read per parameter per step."""

    def on_step_end(self, state):
        self.norms = [p.detach().norm().item() for p in state.model.parameters()]


def reads_weights():
    return ReadsWeights()

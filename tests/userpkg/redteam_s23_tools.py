"""Planted workloads for the measuring tools' red-team tests (tests/faults/test_redteam_s23_tools.py): a loss
with hidden host reads, a model of many tiny ops."""
import time

import torch.nn.functional as F
from torch import nn


def sync_loss(out, y):
    """Cross-entropy, then a per-sample Python loop reading each loss back (`.item()`), and a sleep for the
    logging it feeds: host work hidden in the loss, each read a device sync on a GPU."""
    per = F.cross_entropy(out, y, reduction="none")
    total = 0.0
    for v in per:  # a per-sample host read: each is a sync on a GPU and a Python round trip anywhere
        total += float(v.item())
    time.sleep(0.02)
    return per.mean()


class TinyOps(nn.Module):
    """One small linear layer, then `n` elementwise ops on a tiny tensor: dispatch cost, not arithmetic."""

    def __init__(self, n: int = 400):
        super().__init__()
        self.net, self.n = nn.Linear(32, 4), n

    def forward(self, x):
        h = self.net(x)
        for _ in range(self.n):
            h = h * 1.0001 + 0.0
        return h


def tiny_ops(n: int = 400):
    return TinyOps(n)


def copy_loss(out, y):
    """Cross-entropy, then the per-sample losses copied to the host once a step (`.cpu()`, for logging): no
    scalar read, yet on a GPU the copy waits for every kernel queued before it."""
    per = F.cross_entropy(out, y, reduction="none")
    per.detach().cpu()
    return per.mean()

"""Plants for tests/faults/test_lead_s26.py.

    own_loss(dim=8, kind="tensor")   forward(x, y) computing its own MSE loss and returning it the way a loop of
                                     HF Trainer or Accelerate reads it: "tensor", "dict" ({"loss", "logits"}),
                                     "output" (an object with .loss and .logits, as a ModelOutput), "tuple"
                                     ((loss, logits)), or "logits" ({"logits"} only: no loss to take)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


class OwnLoss(nn.Module):
    def __init__(self, dim: int, kind: str):
        super().__init__()
        self.fc, self.kind = nn.Linear(dim, 1), kind

    def forward(self, x, y):
        logits = self.fc(x).squeeze(-1)
        loss = F.mse_loss(logits, y)
        return {"tensor": loss, "dict": {"loss": loss, "logits": logits}, "output": Output(loss, logits),
                "tuple": (loss, logits), "logits": {"logits": logits}}[self.kind]


def own_loss(dim: int = 8, kind: str = "tensor") -> nn.Module:
    return OwnLoss(dim, kind)

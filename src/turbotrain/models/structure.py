"""What turbotrain needs to know about a model's structure: its repeated blocks (the unit of activation
checkpointing, per-block compile and FSDP2 sharding) and the model + loss pair that a step calls."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class WithLoss(nn.Module):
    """model + loss as one module, so `scope="model"` compiles the loss into the same graph as the head
    (no fp32 logits round trip through memory)."""

    def __init__(self, model: nn.Module, loss_fn: Callable | None):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is None:
            return self.model(x, y)
        return self.loss_fn(self.model(x), y)


def find_blocks(model: nn.Module) -> nn.ModuleList | nn.Sequential | None:
    """The repeated blocks of a model: `model.blocks` if present, else its longest ModuleList/Sequential."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        return blocks
    lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1]
    return max(lists, key=len, default=None)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP and the loss wrapper: checkpoints are the same for every strategy."""
    model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return model.model if isinstance(model, WithLoss) else model

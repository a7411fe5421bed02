"""The deep MLP seed workload: depth × [Linear(width), LayerNorm, GELU, Dropout] and a classifier head."""
from __future__ import annotations

from torch import nn


class MLP(nn.Module):
    def __init__(self, in_features: int, width: int, depth: int, num_classes: int, dropout: float):
        super().__init__()
        self.stem = nn.Linear(in_features, width) if in_features != width else nn.Identity()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(), nn.Dropout(dropout))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        x = self.stem(x.flatten(1))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(in_features: int = 1024, width: int = 1024, depth: int = 24, num_classes: int = 1000,
          dropout: float = 0.1) -> MLP:
    return MLP(in_features, width, depth, num_classes, dropout)

"""The deep MLP seed workload: depth × [Linear(width), LayerNorm, GELU, Dropout] and a classifier head."""
from __future__ import annotations

from torch import nn

from turbotrain.contract import float_arg, int_arg


class MLP(nn.Module):
    def __init__(self, in_features: int, width: int, depth: int, num_classes: int, dropout: float):
        super().__init__()
        self.in_features, self.num_classes = in_features, num_classes
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
    int_arg("model.args.in_features", in_features, 1)
    int_arg("model.args.width", width, 1)
    int_arg("model.args.depth", depth, 0)
    int_arg("model.args.num_classes", num_classes, 1)
    float_arg("model.args.dropout", dropout, 0.0, 1.0, hi_open=True)
    return MLP(in_features, width, depth, num_classes, dropout)


def estimate_params(in_features: int, width: int, depth: int, num_classes: int, **_) -> int:
    """`build(...)`'s parameter count, checked against host memory before building (LayerNorms included)."""
    stem = (in_features + 1) * width if in_features != width else 0
    return stem + depth * (width * width + 3 * width) + (width + 1) * num_classes

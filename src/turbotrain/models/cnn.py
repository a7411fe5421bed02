"""A small convnet for 28×28 grayscale images (Fashion-MNIST): two conv stages, BatchNorm, a linear head."""
from __future__ import annotations

from torch import nn


def _stage(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


def build(in_channels: int = 1, num_classes: int = 10, width: int = 32, dropout: float = 0.25) -> nn.Module:
    return nn.Sequential(
        _stage(in_channels, width), _stage(width, 2 * width),  # 28 → 14 → 7
        nn.Flatten(), nn.Dropout(dropout),
        nn.Linear(2 * width * 7 * 7, 256), nn.ReLU(inplace=True), nn.Dropout(dropout),
        nn.Linear(256, num_classes),
    )

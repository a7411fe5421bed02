"""A small convnet for 28×28 grayscale images (Fashion-MNIST): two conv stages, BatchNorm, a linear head."""
from __future__ import annotations

from torch import nn

from turbotrain.contract import float_arg, int_arg


class CNN(nn.Sequential):
    """nn.Sequential (same state_dict keys) that declares its input: (in_channels, 28, 28) images."""
    image_size = 28

    def __init__(self, in_channels: int, num_classes: int, *layers: nn.Module):
        super().__init__(*layers)
        self.in_channels, self.num_classes = in_channels, num_classes


def _stage(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


def build(in_channels: int = 1, num_classes: int = 10, width: int = 32, dropout: float = 0.25) -> nn.Module:
    """Takes 28x28 images (two 2x pools to 7x7 before the linear head)."""
    int_arg("model.args.in_channels", in_channels, 1)
    int_arg("model.args.num_classes", num_classes, 1)
    int_arg("model.args.width", width, 1)
    float_arg("model.args.dropout", dropout, 0.0, 1.0, hi_open=True)
    return CNN(
        in_channels, num_classes,
        _stage(in_channels, width), _stage(width, 2 * width),  # 28 → 14 → 7
        nn.Flatten(), nn.Dropout(dropout),
        nn.Linear(2 * width * 7 * 7, 256), nn.ReLU(inplace=True), nn.Dropout(dropout),
        nn.Linear(256, num_classes),
    )


def estimate_params(in_channels: int, num_classes: int, width: int, **_) -> int:
    """`build(...)`'s parameter count (convolutions, batch norms, the two linears), checked against host memory
    before building."""
    convs = 9 * in_channels * width + 9 * width * width + 9 * width * 2 * width + 9 * 2 * width * 2 * width
    return convs + 12 * width + (2 * width * 49 + 1) * 256 + 257 * num_classes

"""ResNet-50 (bottleneck v1.5, torchvision's layout) without a torchvision dependency."""
from __future__ import annotations

import torch
from torch import nn

from turbotrain.contract import int_arg
from turbotrain.errors import UserError


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        nn.init.zeros_(self.bn3.weight)  # zero-init the last BN: each block starts as identity
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + idt)


class ResNet(nn.Module):
    def __init__(self, layers: list[int], num_classes: int, in_channels: int, base_width: int):
        super().__init__()
        self.in_channels, self.num_classes = in_channels, num_classes
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, base_width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(base_width), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks, cin = [], base_width
        for i, n in enumerate(layers):
            width = base_width * 2**i
            for j in range(n):
                blocks.append(Bottleneck(cin, width, stride=2 if (j == 0 and i > 0) else 1))
                cin = width * Bottleneck.expansion
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(self.pool(x).flatten(1))


def build(depth: int = 50, num_classes: int = 1000, in_channels: int = 3, base_width: int = 64) -> ResNet:
    layers = {50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}
    int_arg("model.args.num_classes", num_classes, 1)
    int_arg("model.args.in_channels", in_channels, 1)
    int_arg("model.args.base_width", base_width, 1)
    if isinstance(depth, bool) or depth not in layers:
        raise UserError(f"model.args.depth = {depth}: expected one of {', '.join(map(str, sorted(layers)))} "
                        "(bottleneck ResNets)")
    return ResNet(layers[depth], num_classes, in_channels, base_width)

"""User code for tests/faults/test_redteam_s24_combos.py: models that combine techniques (blocks holding
BatchNorm or dropout, for activation checkpointing under compile)."""
from __future__ import annotations

import torch
from torch import nn


class _BnBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.bn = nn.BatchNorm1d(dim)

    def forward(self, x):
        return x + torch.relu(self.bn(self.fc(x)))


class BnBlocks(nn.Module):
    """Repeated blocks holding BatchNorm (running statistics updated in the forward)."""

    def __init__(self, dim: int = 8, n: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(_BnBlock(dim) for _ in range(n))
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.out(x).squeeze(-1)


def bn_blocks(dim: int = 8):
    return BnBlocks(dim)


class _DropBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.drop(torch.relu(self.fc(x)))


class DropBlocks(BnBlocks):
    """Repeated blocks holding dropout (a random mask the recompute must draw again exactly)."""

    def __init__(self, dim: int = 8, n: int = 2):
        super().__init__(dim, n)
        self.blocks = nn.ModuleList(_DropBlock(dim) for _ in range(n))


def drop_blocks(dim: int = 8):
    return DropBlocks(dim)


class _InplaceBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.act = nn.ReLU(inplace=True)  # over the linear's output, which selective checkpointing keeps

    def forward(self, x):
        return x + self.act(self.fc(x))


class InplaceBlocks(BnBlocks):
    def __init__(self, dim: int = 8, n: int = 2):
        super().__init__(dim, n)
        self.blocks = nn.ModuleList(_InplaceBlock(dim) for _ in range(n))


def inplace_blocks(dim: int = 8):
    return InplaceBlocks(dim)


class _InputWriter(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        x *= 0.5  # over the block's input: fine without checkpointing (nothing saved it)
        return self.fc(torch.relu(x))


class InputWriterBlocks(BnBlocks):
    def __init__(self, dim: int = 8, n: int = 2):
        super().__init__(dim, n)
        self.inp = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(_InputWriter(dim) for _ in range(n))

    def forward(self, x):
        return super().forward(self.inp(x))


def input_writer_blocks(dim: int = 8):
    return InputWriterBlocks(dim)

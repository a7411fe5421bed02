"""User models of unusual kinds for tests/faults/test_redteam_s23_models.py (factories `build(dim=8)`, on
userpkg.data:regression: (B, dim) float inputs, (B,) float targets).

    sparse        an nn.EmbeddingBag(sparse=True) beside the linear layer: sparse gradients
    int_out       forward returns an int64 tensor;  complex_out: a complex64 one
    meta          built on the meta device (shapes, no storage)
    views         two parameters that are views of one storage (a fused tensor split by hand)
    tied          two layers sharing one weight
    lazy          an nn.LazyLinear
    graph_break   a data-dependent branch on .item(): a graph break under torch.compile
"""
from __future__ import annotations

import torch
from torch import nn
from userpkg.redteam_s22 import Lazy


class Lin(nn.Module):
    def __init__(self, dim: int = 8):
        super().__init__()
        self.fc = nn.Linear(dim, 1)

    def forward(self, x):
        return self.fc(x).squeeze(-1)


class Sparse(Lin):
    def __init__(self, dim: int = 8):
        super().__init__(dim)
        self.emb = nn.EmbeddingBag(16, 1, sparse=True)

    def forward(self, x):
        return super().forward(x) + self.emb(torch.zeros(x.shape[0], 1, dtype=torch.long)).squeeze(-1)


def sparse(dim: int = 8):
    return Sparse(dim)


class IntOut(Lin):
    def forward(self, x):
        return (super().forward(x) * 100).long()


def int_out(dim: int = 8):
    return IntOut(dim)


class ComplexOut(Lin):
    def forward(self, x):
        out = super().forward(x)
        return torch.complex(out, out)


def complex_out(dim: int = 8):
    return ComplexOut(dim)


def meta(dim: int = 8):
    with torch.device("meta"):
        return Lin(dim)


class Views(nn.Module):
    def __init__(self, dim: int = 8):
        super().__init__()
        fused = torch.randn(2, dim) * 0.1
        self.w1, self.w2 = nn.Parameter(fused[0]), nn.Parameter(fused[1])

    def forward(self, x):
        return x @ self.w1 + x @ self.w2


def views(dim: int = 8):
    return Views(dim)


class Tied(nn.Module):
    def __init__(self, dim: int = 8):
        super().__init__()
        self.a, self.b = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.b.weight = self.a.weight
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        return self.out(self.b(self.a(x))).squeeze(-1)


def tied(dim: int = 8):
    return Tied(dim)


def lazy(dim: int = 8):
    return Lazy()


class GraphBreak(Lin):
    def forward(self, x):
        out = super().forward(x)
        if out.sum().item() > 1e9:
            return out * 2
        return out


def graph_break(dim: int = 8):
    return GraphBreak(dim)

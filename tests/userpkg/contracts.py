"""User code that breaks the trainer's contract, one way each, for tests/faults/test_contracts.py.

Models (factories `build(**args) -> nn.Module`):
    no_params()                 a model with no parameters at all
    frozen(dim=8)               a Linear whose parameters all have requires_grad=False
    returns_tuple(dim=8)        forward returns (out, out), not a tensor
    returns_list(dim=8)         forward returns a Python list of floats
    classifier(dim=8, classes=3)  a working linear classifier: (B, dim) -> (B, classes)
    pos_first_lm(vocab=16, block=8)  a token model whose FIRST embedding is positional (no vocab attribute)
    loss_model(dim=8)           forward(x, y) returns the scalar mse loss (train.loss = "model")
    loss_model_vector(dim=8)    forward(x, y) returns the per-element loss (not a scalar)

Data factories (`build(split, **args) -> Dataset`):
    single_tensor / dict_items / triple / none_items / string_targets / ragged / numpy_pairs
    labels(n=32, dim=8, classes=5)  float inputs, int64 labels 0..classes-1
    float64_inputs(n=32, dim=8)     float64 inputs, float32 targets

Losses (`fn(out, y)`):
    per_element  python_float  detached  returns_none  integer_loss  shape_error  mean_l1 (a working one)
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

# ---------------------------------------------------------------- models


class NoParams(nn.Module):
    def forward(self, x):
        return x.sum(-1)


def no_params() -> nn.Module:
    return NoParams()


class Head(nn.Module):
    def __init__(self, dim: int, out: int = 1):
        super().__init__()
        self.fc = nn.Linear(dim, out)

    def forward(self, x):
        return self.fc(x).squeeze(-1)


def frozen(dim: int = 8) -> nn.Module:
    m = Head(dim)
    for p in m.parameters():
        p.requires_grad_(False)
    return m


class ReturnsTuple(Head):
    def forward(self, x):
        out = super().forward(x)
        return out, out


def returns_tuple(dim: int = 8) -> nn.Module:
    return ReturnsTuple(dim)


class ReturnsList(Head):
    def forward(self, x):
        return super().forward(x).tolist()


def returns_list(dim: int = 8) -> nn.Module:
    return ReturnsList(dim)


class Classifier(nn.Module):
    def __init__(self, dim: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(dim, classes)

    def forward(self, x):
        return self.fc(x)


def classifier(dim: int = 8, classes: int = 3) -> nn.Module:
    return Classifier(dim, classes)


class PosFirstLM(nn.Module):
    """Registers its position embedding (block rows) before its token embedding (vocab rows): a check
    that took the first nn.Embedding for the vocabulary would be wrong here."""

    def __init__(self, vocab: int, block: int, dim: int = 16):
        super().__init__()
        self.pos = nn.Embedding(block, dim)
        self.tok = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        return self.head(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))


def pos_first_lm(vocab: int = 16, block: int = 8) -> nn.Module:
    return PosFirstLM(vocab, block)


class LossModel(Head):
    def forward(self, x, y):
        return F.mse_loss(super().forward(x), y)


def loss_model(dim: int = 8) -> nn.Module:
    return LossModel(dim)


class LossModelVector(Head):
    def forward(self, x, y):
        return F.mse_loss(super().forward(x), y, reduction="none")


def loss_model_vector(dim: int = 8) -> nn.Module:
    return LossModelVector(dim)


# ---------------------------------------------------------------- data


class Items(Dataset):
    """n items made by `make(i)`."""

    def __init__(self, n: int, make):
        self.n, self.make = n, make

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


def _x(i: int, dim: int = 8) -> torch.Tensor:
    return torch.randn(dim, generator=torch.Generator().manual_seed(i))


def single_tensor(split: str, n: int = 32, dim: int = 8) -> Dataset:
    return Items(n, lambda i: _x(i, dim))


def dict_items(split: str, n: int = 32, dim: int = 8) -> Dataset:
    return Items(n, lambda i: {"x": _x(i, dim), "y": torch.tensor(0.0)})


def triple(split: str, n: int = 32, dim: int = 8) -> Dataset:
    return Items(n, lambda i: (_x(i, dim), torch.tensor(0.0), torch.tensor(1.0)))


def none_items(split: str, n: int = 32) -> Dataset:
    return Items(n, lambda i: None)


def string_targets(split: str, n: int = 32, dim: int = 8) -> Dataset:
    return Items(n, lambda i: (_x(i, dim), f"label-{i}"))


def ragged(split: str, n: int = 32, dim: int = 8) -> Dataset:
    return Items(n, lambda i: (_x(i, dim + i % 2), torch.tensor(0.0)))


def numpy_pairs(split: str, n: int = 32, dim: int = 8) -> Dataset:
    """Valid: numpy float32 inputs and Python float targets collate into tensors."""
    return Items(n, lambda i: (_x(i, dim).numpy(), float(i)))


def labels(split: str, n: int = 32, dim: int = 8, classes: int = 5) -> Dataset:
    return Items(n, lambda i: (_x(i, dim), torch.tensor((i + classes - 1) % classes)))


def float64_inputs(split: str, n: int = 32, dim: int = 8) -> Dataset:
    return Items(n, lambda i: (np.asarray(_x(i, dim).numpy(), dtype=np.float64), torch.tensor(0.0)))


# ---------------------------------------------------------------- losses


def mean_l1(out, y):
    return F.l1_loss(out.float(), y.float())


def per_element(out, y):
    return F.mse_loss(out.float(), y.float(), reduction="none")


def python_float(out, y):
    return F.mse_loss(out.float(), y.float()).item()


def detached(out, y):
    return torch.tensor(F.mse_loss(out.float(), y.float()).item())


def returns_none(out, y):
    return None


def integer_loss(out, y):
    return (out - y).abs().sum().long()


def shape_error(out, y):
    return F.mse_loss(out, y.reshape(3, -1).sum(0)).mean() + torch.zeros(5, 7) @ torch.zeros(6, 1)

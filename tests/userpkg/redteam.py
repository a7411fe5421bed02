"""User code for tests/faults/test_redteam_user.py: callbacks, metrics, optimizers, models and datasets that
break the contract in the ways a red team tries first."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from turbotrain.callbacks import Callback


class RaisingCallback(Callback):
    def on_step_end(self, state):
        raise ValueError("boom in on_step_end")


class RaisingStart(Callback):
    def on_train_start(self, state):
        raise RuntimeError("boom in on_train_start")


class LogReturnsList(Callback):
    def on_log(self, state):
        return [1, 2]


class LogReturnsTensor(Callback):
    def on_log(self, state):
        return {"t": torch.tensor(1.0)}


class LogReturnsNaN(Callback):
    def on_log(self, state):
        return {"nanmetric": float("nan")}


class NeedsArg(Callback):
    def __init__(self, x):
        self.x = x


class InitRaises(Callback):
    def __init__(self):
        raise RuntimeError("bad init")


class NoHooks:
    pass


class EndRaises(Callback):
    def on_train_end(self, state, summary):
        raise KeyError("missing")


def metric_tensor(out, y):
    return (out.reshape(y.shape) - y).abs().mean()


def metric_vector(out, y):
    return (out.reshape(y.shape) - y).abs()


def metric_none(out, y):
    return None


def metric_nan(out, y):
    return float("nan")


def metric_string(out, y):
    return "0.5"


def metric_raises(out, y):
    raise ZeroDivisionError("metric bug")


def metric_dict(out, y):
    return {"a": 1.0}


def opt_returns_none(param_groups, lr, weight_decay):
    return None


def opt_ignores_groups(param_groups, lr, weight_decay):
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


def opt_raises(param_groups, lr, weight_decay):
    raise ValueError("bad opt")


def opt_kwargs_only(params, learning_rate=0.1):
    return torch.optim.SGD(params, lr=learning_rate)


class TupleOut(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, 1)

    def forward(self, x):
        return self.fc(x).squeeze(-1), x


def tuple_out(dim=8):
    return TupleOut(dim)


class DictOut(TupleOut):
    def forward(self, x):
        return {"logits": self.fc(x).squeeze(-1)}


def dict_out(dim=8):
    return DictOut(dim)


class BufferModel(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.fc = nn.Linear(dim, 1)
        self.register_buffer("scale", torch.full((dim,), 2.0))

    def forward(self, x):
        return self.fc(self.frozen(x) * self.scale).squeeze(-1)


def buffers(dim=8):
    return BufferModel(dim)


class BNModel(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.bn = nn.BatchNorm1d(dim)
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        return self.out(self.bn(self.fc(x))).squeeze(-1)


def batchnorm(dim=8):
    return BNModel(dim)


class ShapeShift(Dataset):
    """Items 0 and 1 are (dim,) floats; later items change shape (or dtype)."""

    def __init__(self, n=64, dim=8, mode="shape"):
        self.n, self.dim, self.mode = n, dim, mode

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(self.dim, generator=g), torch.randn((), generator=g)
        if i >= 2 and self.mode == "shape":
            x = torch.randn(self.dim + 3, generator=g)
        if i >= 2 and self.mode == "dtype":
            x = x.double()
        if i >= 2 and self.mode == "none":
            return None
        return x, y


def shape_shift(split, n=64, dim=8, mode="shape"):
    return ShapeShift(n, dim, mode)


class Dicts(Dataset):
    def __init__(self, n=64, dim=8, keys=("inputs", "labels")):
        self.n, self.dim, self.keys = n, dim, keys

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        vals = {"inputs": torch.randn(self.dim, generator=g), "input_ids": torch.randn(self.dim, generator=g),
                "labels": torch.randn((), generator=g), "label": torch.randn((), generator=g)}
        return {k: vals[k] for k in self.keys}


def dicts(split, n=64, dim=8, keys=("inputs", "labels")):
    return Dicts(n, dim, tuple(keys))


def dicts_missing_later(split, n=64, dim=8):
    class D(Dicts):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            if i >= 2:
                item.pop("labels")
            return item
    return D(n, dim)


def returns_list(split, n=64, dim=8):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(dim, generator=g), torch.randn((), generator=g)) for _ in range(n)]


def model_returns_hf_config(dim=8):
    return "hf:gpt2"


def loss_returns_nan(out, y):
    return (out * float("nan")).mean()


def loss_returns_int_tensor(out, y):
    return (out.sum() > 0).long()


def loss(out, y):
    """An eval metric whose name would collide with val_loss."""
    return 0.0

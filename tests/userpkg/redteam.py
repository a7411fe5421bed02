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


# ---- the user's code failing where only evaluation (eval mode, no_grad, every val item) goes


class ValFailsAt(Dataset):
    """A regression split whose items from `at` on fail (val only: training's checks read items 0 and 1)."""

    def __init__(self, split, n=64, dim=8, at=4, mode="raise"):
        g = torch.Generator().manual_seed(0 if split == "train" else 1)
        self.x, self.y = torch.randn(n, dim, generator=g), torch.randn(n)
        self.split, self.at, self.mode = split, at, mode

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.split == "val" and i >= self.at:
            if self.mode == "raise":
                raise LookupError(f"val item {i} is gone")
            return self.x[i][:3], self.y[i]  # a narrower item: cannot be batched with the first ones
        return self.x[i], self.y[i]


def val_fails_at(split, n=64, dim=8, at=4, mode="raise"):
    return ValFailsAt(split, n, dim, at, mode)


class EvalMode(nn.Module):
    """Trains fine; in eval mode its forward raises, returns a pair, or (train.loss = "model") an int loss."""

    def __init__(self, dim=8, mode="raise"):
        super().__init__()
        self.fc, self.mode = nn.Linear(dim, 1), mode

    def forward(self, x, y=None):
        out = self.fc(x).squeeze(-1)
        if self.training:
            return out if y is None else ((out - y) ** 2).mean()
        if self.mode == "raise":
            raise NotImplementedError("no eval path yet")
        if self.mode == "pair":
            return out, x
        return torch.tensor(3)


def eval_mode(dim=8, mode="raise"):
    return EvalMode(dim, mode)


class NoItemZero(Dataset):
    """Keyed from 1, as a dict-backed dataset may be: item 0 raises KeyError."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 0:
            raise KeyError(i)
        return torch.randn(8), torch.randn(())


def no_item_zero(split):
    return NoItemZero()


class NegativeLen(NoItemZero):
    def __len__(self):
        return -1


def negative_len(split):
    return NegativeLen()


class LogNonStringKey(Callback):
    def on_log(self, state):
        return {1: 0.5}


class LogValLoss(Callback):
    """A name only evaluation rows hold: on the other rows it would pass for a measured val_loss."""

    def on_log(self, state):
        return {"val_loss": 0.5}


class LogHugeInt(Callback):
    def on_log(self, state):
        return {"count": 10**400}


class FailsAtCall(nn.Module):
    """Passes the contract's first forward; its forward raises from call `at` on (a bug on a later batch)."""

    def __init__(self, dim=8, at=3):
        super().__init__()
        self.fc, self.at, self.calls = nn.Linear(dim, 1), at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls >= self.at:
            raise ArithmeticError(f"forward broke at call {self.calls}")
        return self.fc(x).squeeze(-1)


def fails_at_call(dim=8, at=3):
    return FailsAtCall(dim, at)


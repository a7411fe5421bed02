"""User code for tests/faults/test_redteam_user2.py: data that goes bad after its first items, models whose
weights or gradients go non-finite while the loss stays finite, optimizers turbotrain cannot step, and callbacks,
factories and losses of the wrong kind. Datasets are small (64 items of 8 features) as userpkg.data's."""
from __future__ import annotations

import sys
import threading

import torch
from torch import nn
from torch.utils.data import Dataset

from turbotrain.callbacks import Callback


class Classes(Dataset):
    """Features with int64 labels 0..2; from item `bad_at` on the label is `bad_label` (any order the sampler
    draws puts some of them in an early batch, never in items 0 and 1, which the contract checks first)."""

    def __init__(self, n: int, bad_at: int, bad_label: int):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
        self.bad_at, self.bad_label = bad_at, bad_label

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], (torch.tensor(self.bad_label) if i >= self.bad_at else self.y[i])


def classes(split, n=64, bad_at=2, bad_label=7):
    return Classes(n, bad_at if split == "train" else n, bad_label)


class Classifier(nn.Module):
    def __init__(self, out: int = 3):
        super().__init__()
        self.fc = nn.Linear(8, out)

    def forward(self, x):
        return self.fc(x)


def classifier(out=3):
    return Classifier(out)


class Tokens(Dataset):
    """Token sequences of 16 ids below 50 (next-token targets); from item `bad_at` on, id 80 at position 3."""

    def __init__(self, n: int, bad_at: int):
        self.t = torch.randint(0, 50, (n, 17), generator=torch.Generator().manual_seed(0))
        self.bad_at = bad_at

    def __len__(self):
        return len(self.t)

    def __getitem__(self, i):
        t = self.t[i].clone()
        if i >= self.bad_at:
            t[3] = 80
        return t[:-1], t[1:]


def tokens(split, n=64, bad_at=2):
    return Tokens(n, bad_at if split == "train" else n)


class Padded(Tokens):
    """Hugging Face style padding: the last 4 target positions of every item are -100 (ignored by the loss)."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        y = y.clone()
        y[-4:] = -100
        return x, y


def padded(split, n=64):
    return Padded(n, n)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 50):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, 16), nn.Linear(16, vocab)

    def forward(self, x):
        return self.head(self.emb(x))


def tiny_lm(vocab=50):
    return TinyLM(vocab)


class WidensAt(nn.Module):
    """Returns (B,) like userpkg.models:linear, then (B, 3) from its `at`-th training forward on."""

    def __init__(self, at: int):
        super().__init__()
        self.fc, self.at, self.calls = nn.Linear(8, 3), at, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
        out = self.fc(x)
        return out if self.calls >= self.at else out[:, 0]


def widens_at(at=5):
    return WidensAt(at)


class GradItems(Dataset):
    """Items computed once from a parameter: they hang on an autograd graph."""

    def __init__(self):
        w = nn.Parameter(torch.ones(8))
        self.x, self.y = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * w, torch.zeros(64)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def grad_items(split):
    return GradItems()


class NaNGrad(nn.Module):
    """A branch the forward never takes: its gradient is NaN (0 x NaN), the loss stays finite."""

    def __init__(self):
        super().__init__()
        self.fc, self.p = nn.Linear(8, 1), nn.Parameter(torch.zeros(()))

    def forward(self, x):
        side = torch.where(self.p > 1.0, torch.sqrt(-self.p), torch.zeros_like(self.p))
        return self.fc(x).squeeze(-1) + side


def nan_grad():
    return NaNGrad()


class ScaleOnly(nn.Module):
    """A parameter of the model's own (no module with reset_parameters() holds it)."""

    def __init__(self):
        super().__init__()
        self.scale, self.fc = nn.Parameter(torch.ones(8)), nn.Linear(8, 1)

    def forward(self, x):
        return self.fc(x * self.scale).squeeze(-1)


def scale_only():
    return ScaleOnly()


class Masked(ScaleOnly):
    """ScaleOnly with a buffer used in forward and an init_weights() that sets everything."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.ones(8))

    def forward(self, x):
        return self.fc(x * self.scale * self.mask).squeeze(-1)

    def init_weights(self):
        nn.init.ones_(self.scale)
        self.fc.reset_parameters()


def masked():
    return Masked()


def nan_at_some_steps(out, y):
    """mse, NaN at calls 4 and 6 only (never 3 in a row: the run does not stop); the NaN is a constant added,
    so the gradients stay finite and the weights with them."""
    nan_at_some_steps.calls = getattr(nan_at_some_steps, "calls", 0) + 1
    loss = torch.nn.functional.mse_loss(out, y.float())
    return loss + torch.tensor(float("nan")) if nan_at_some_steps.calls in (4, 6) else loss


def lbfgs(param_groups, lr, weight_decay):
    return torch.optim.LBFGS([p for g in param_groups for p in g["params"]], lr=lr)


def sparse_adam(param_groups, lr, weight_decay):
    return torch.optim.SparseAdam([p for g in param_groups for p in g["params"]], lr=lr)


class GpuTemp(Callback):
    """Returns names of the trainer's GPU metrics, absent on a CPU run's rows."""

    def on_log(self, state):
        return {"gpu_temp_c": 99.0}


class Exits(Callback):
    def on_step_end(self, state):
        if state.step == 2:
            sys.exit(0)


MODULE_INSTANCE = nn.Linear(8, 1)


class Blocks(Dataset):
    """Every read blocks forever."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        threading.Event().wait()


def blocks(split):
    return Blocks()


class NaNTargets(Dataset):
    """Regression items whose targets are NaN from item `bad_at` on."""

    def __init__(self, n: int, bad_at: int):
        self.x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
        self.y, self.bad_at = self.x.sum(-1), bad_at

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], (torch.tensor(float("nan")) if i >= self.bad_at else self.y[i])


def nan_targets(split, n=64, bad_at=2):
    return NaNTargets(n, bad_at if split == "train" else n)


class FloatClasses(Classes):
    num_classes = 3.0  # a size as a float: turbotrain fills model.args.num_classes from it


def float_classes(split, n=64):
    return FloatClasses(n, n, 0)


def classifier_of(num_classes):
    return Classifier(num_classes)


class EvalNaN(nn.Module):
    """A linear model whose eval-mode output is NaN (training is fine)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x):
        out = self.fc(x).squeeze(-1)
        return out if self.training else out * float("nan")


def eval_nan():
    return EvalNaN()


class HugeLen(Classes):
    def __len__(self):
        return 10**12


def huge_len(split):
    return HugeLen(64, 64, 0)

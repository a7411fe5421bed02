"""User code for tests/faults/test_redteam_s22_run.py: models of awkward kinds (no parameters, frozen ones,
lazy ones, tied ones, outputs of odd types, float64/float16 weights), factories and callbacks that misbehave.
Every model takes (B, 8) float features and regresses (B,) targets like userpkg.models:linear."""
from __future__ import annotations

import os
from collections import OrderedDict

import torch
from torch import nn

from turbotrain.callbacks import Callback


class NoParams(nn.Module):
    def forward(self, x):
        return x.sum(-1)


def no_params():
    return NoParams()


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
        self.fc.requires_grad_(False)

    def forward(self, x):
        return self.fc(x).squeeze(-1)


def frozen():
    return Frozen()


class BuffersOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.ones(8))

    def forward(self, x):
        return x @ self.w


def buffers_only():
    return BuffersOnly()


class Lazy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.LazyLinear(1)

    def forward(self, x):
        return self.fc(x).squeeze(-1)


def lazy():
    return Lazy()


class Tied(nn.Module):
    """One Linear reached by two names: its parameters are shared."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = self.a
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.b(torch.tanh(self.a(x))))).squeeze(-1)


def tied():
    return Tied()


class Returns(nn.Module):
    """Its output wrapped as `kind` says: tuple, dict, ordered, none, scalar, list, int."""

    def __init__(self, kind: str):
        super().__init__()
        self.fc, self.kind = nn.Linear(8, 1), kind

    def forward(self, x):
        out = self.fc(x).squeeze(-1)
        return {"tuple": (out, out.detach()), "dict": {"logits": out}, "ordered": OrderedDict(logits=out),
                "none": None, "scalar": out.sum(), "list": [out], "int": 3, "str": "out"}[self.kind]


def returns(kind="tuple"):
    return Returns(kind)


class NeedsKwarg(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x, *, scale):
        return self.fc(x * scale).squeeze(-1)


def needs_kwarg():
    return NeedsKwarg()


class Mutates(nn.Module):
    """Scales its input in place: the batch the loader handed over changes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x):
        x.mul_(2.0)
        return self.fc(x).squeeze(-1)


def mutates():
    return Mutates()


class RaisesAt(nn.Module):
    def __init__(self, at: int):
        super().__init__()
        self.fc, self.at, self.calls = nn.Linear(8, 1), at, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                raise ValueError("boom in forward")
        return self.fc(x).squeeze(-1)


def raises_at(at=3):
    return RaisesAt(at)


class Linear(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.fc = nn.Linear(8, 1, dtype=dtype)

    def forward(self, x):
        return self.fc(x.to(self.fc.weight.dtype)).squeeze(-1)


def float64():
    return Linear(torch.float64)


def float16():
    return Linear(torch.float16)


def bfloat16():
    return Linear(torch.bfloat16)


def on_meta():
    with torch.device("meta"):
        return Linear()


def raises():
    raise RuntimeError("factory failed")


def returns_list():
    return [nn.Linear(8, 1)]


def returns_class():
    return Linear


def wants(width):
    return Linear()


class Exit(Callback):
    """Calls os._exit / raises KeyboardInterrupt / returns odd metrics at a hook, as `how` says."""

    def __init__(self, how="os_exit", hook="on_step_end"):
        self.how, self.hook = how, hook

    def _act(self):
        if self.how == "os_exit":
            os._exit(3)
        if self.how == "keyboard":
            raise KeyboardInterrupt
        if self.how == "baseexc":
            raise GeneratorExit


class OddLog(Callback):
    def __init__(self, value=None):
        self.value = value

    def on_log(self, state):
        return self.value


class Complex(nn.Module):
    """A complex-valued parameter (a learned phase): real outputs."""

    def __init__(self):
        super().__init__()
        self.fc, self.phase = nn.Linear(8, 1), nn.Parameter(torch.ones(8, dtype=torch.complex64))

    def forward(self, x):
        return self.fc(x * self.phase.abs()).squeeze(-1)


def complex_param():
    return Complex()


class SparseEmb(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.fc = nn.Embedding(10, 8, sparse=True), nn.Linear(8, 1)

    def forward(self, x):
        return self.fc(x + self.emb.weight[:1]).squeeze(-1)


def sparse_emb():
    return SparseEmb()


def compiled():
    return torch.compile(Linear())


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.spare = nn.Linear(8, 1), nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).squeeze(-1)


def unused():
    return Unused()


def data_parallel():
    return nn.DataParallel(Linear())


def rprop_flat(param_groups, lr, weight_decay):
    """An optimizer with no weight decay of its own, over the parameters without their groups."""
    return torch.optim.Rprop([p for g in param_groups for p in g["params"]], lr=lr)


BUILT: list = []  # the optimizers two_lrs built, newest last


def two_lrs(param_groups, lr, weight_decay):
    """AdamW whose no-decay group (biases) learns at a tenth of the lr."""
    decay, no_decay = param_groups
    opt = torch.optim.AdamW([decay, {**no_decay, "lr": lr / 10}], lr=lr, weight_decay=weight_decay)
    BUILT.append(opt)
    return opt


class TrainNoMode(Linear):
    """Overrides train() without its `mode` argument (model.eval() calls train(False))."""

    def train(self):
        return super().train(True)


def train_no_mode():
    return TrainNoMode()


class ModeSpy(Linear):
    """Records whether each forward ran in training mode."""

    def __init__(self):
        super().__init__()
        self.modes: list[bool] = []

    def forward(self, x):
        self.modes.append(self.training)
        return super().forward(x)


class Sampler(Callback):
    """Runs the model in eval mode at each log step, as a sample-generation callback does, and leaves it so."""

    def on_log(self, state):
        state.model.eval()
        with torch.no_grad():
            state.model(torch.zeros(1, 8))


class ExtraState(Linear):
    """Keeps a plain-data extra state in its state_dict (nn.Module.get_extra_state), as some layers do."""

    def get_extra_state(self):
        return {"calls": 1, "note": "plain data"}

    def set_extra_state(self, state):
        self.extra = state


def extra_state():
    return ExtraState()


class PairBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        h = torch.tanh(self.fc(x)) * scale
        return h, h.mean()


class PairBlocks(nn.Module):
    """Blocks that take a keyword and return a (hidden, aux) tuple."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(PairBlock() for _ in range(2))
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        aux = 0.0
        for b in self.blocks:
            x, a = b(x, scale=0.5)
            aux = aux + a
        return self.out(x).squeeze(-1) + 0 * aux


def pair_blocks():
    return PairBlocks()


class RaisesInWorkers(torch.utils.data.Dataset):
    """Items the main process reads fine (the first-batch checks), a UserError inside a DataLoader worker."""

    def __init__(self, split: str = "train", **_):
        self.split = split

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            from turbotrain.errors import UserError
            raise UserError("data.name: item refused by its own check; fix the dataset")
        return torch.randn(8), torch.randn(1)

"""Boundary checks: what the trainer expects of the code it calls, checked once at build time.

Two kinds:
  - arguments of the built-in factories (`int_arg`, `float_arg`, `bool_arg`, `choice_arg`): each bad value
    is one UserError naming `model.args.X` / `data.args.X` and what is allowed;
  - user code and model×data, on the first item, first batch, first forward and first loss
    (`check_model`, `first_batch`, `check_model_data`): items that are not (inputs, targets), a model
    without trainable parameters, token ids past the model's vocabulary, sequences longer than its
    block_size, layers whose input size does not match the data, labels past the model's classes, a model
    output that is not a tensor, a loss that is not a differentiable scalar. Each is one UserError naming
    the user's function as the config spells it (`data.name = 'pkg.mod:fn'`, `train.loss = ...`).

Usage in build() (see `Names`):
    names = Names.of(cfg, model=model, train_data=train_data, loss_fn=loss_fn)
    check_model(model, names)
    sample = first_batch(train_ds, device, names)
    check_model_data(model, sample, loss_fn, names)
None of this runs per step.
"""
from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from turbotrain.errors import UserError
from turbotrain.models.structure import own_loss
from turbotrain.plugins import call_user

# ---------------------------------------------------------------- arguments of the built-in factories


def _bounds(lo, hi, lo_open: bool = False, hi_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f" {'<' if hi_open else '<='} {hi}"
    return ""


def int_arg(key: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """`int_arg("model.args.n_head", n_head, 1)`: an integer (not a bool, not 2.5) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UserError(f"{key} = {value!r}: expected an integer{_bounds(lo, hi)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise UserError(f"{key} = {value}: must be an integer{_bounds(lo, hi)}")
    return int(value)


def float_arg(key: str, value: Any, lo: float | None = None, hi: float | None = None,
              lo_open: bool = False, hi_open: bool = False) -> float:
    """`float_arg("model.args.dropout", p, 0.0, 1.0, hi_open=True)`: a finite number within the bounds."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        raise UserError(f"{key} = {value!r}: expected a number{_bounds(lo, hi, lo_open, hi_open)}")
    return float(value)


def bool_arg(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{key} = {value!r}: expected true or false")
    return value


def choice_arg(key: str, value: Any, choices: tuple) -> Any:
    if value not in choices:
        raise UserError(f"{key} = {value!r}: expected one of {', '.join(map(repr, choices))}")
    return value


# ---------------------------------------------------------------- who is who, for the messages

@dataclass(frozen=True)
class Names:
    """How the messages name the user's code: as the config spells it, or as passed to train()."""
    model: str = "the model"
    data: str = "the dataset"
    loss: str = "the loss function"

    @classmethod
    def of(cls, cfg, model: Any = None, train_data: Any = None, loss_fn: Any = None) -> "Names":
        """`model`, `train_data`, `loss_fn`: what build() was given (None = built from the config)."""
        return cls(
            model="the model passed to train()" if model is not None else f"model.name = {cfg.model.name!r}",
            data="the train_data passed to train()" if train_data is not None else f"data.name = {cfg.data.name!r}",
            loss="the loss_fn passed to train()" if loss_fn is not None else f"train.loss = {cfg.train.loss!r}",
        )


def _describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        dtype = str(v.dtype).removeprefix("torch.")
        return f"{'an' if dtype.startswith('int') else 'a'} {dtype} tensor of shape {tuple(v.shape)}"
    if isinstance(v, np.ndarray):
        return f"a numpy {v.dtype} array of shape {v.shape}"
    if v is None:
        return "None"
    if isinstance(v, Mapping):
        return f"a dict with keys {list(v)[:6]}"
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)} {'item' if len(v) == 1 else 'items'}"
    if isinstance(v, (numbers.Number, str)):
        return f"a {type(v).__name__} ({v!r})"[:80]
    return f"a {type(v).__name__}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:240]


# ---------------------------------------------------------------- the model alone

def check_model(model: Any, names: Names = Names()) -> None:
    """Call once the model is built: an nn.Module with something to train."""
    if not isinstance(model, nn.Module):
        raise UserError(f"{names.model}: got {_describe(model)}, not a torch.nn.Module")
    from turbotrain.models import check_initialised
    from turbotrain.models.hf import is_hf_model

    check_initialised(model, names.model)
    if is_hf_model(model):  # factories' HF models are adapted in models.build_model; a model given to train() is not
        raise UserError(f"{names.model} is a transformers {type(model).__name__}: pass "
                        f"turbotrain.models.adapt(model) (reads .logits/.loss, passes labels by keyword)")
    if not any(p.requires_grad for p in model.parameters()):
        n = sum(1 for _ in model.parameters())
        raise UserError(f"{names.model}: the model has no trainable parameters ({n} parameters, none with "
                        f"requires_grad): give it layers or nn.Parameters to train, or unfreeze them")
    _say_frozen(model)
    sparse = [name or type(m).__name__ for name, m in model.named_modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse]
    if sparse:  # else the first step dies inside torch: the gradient clip, AdamW and DDP take dense gradients only
        raise UserError(f"{names.model}: sparse=True in {', '.join(sparse[:3])}, whose sparse gradients turbotrain's "
                        f"gradient clipping, optimizers and DDP/FSDP cannot take; build it with sparse=False")


def _say_frozen(model: nn.Module) -> None:
    """Parameters with requires_grad=False (a frozen encoder, embeddings) are left out of the optimizer: said,
    with how many, as a model that trains a part of itself only by mistake would show nothing else."""
    frozen = [(n, p.numel()) for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        from turbotrain.log import say

        total = sum(p.numel() for p in model.parameters())
        say(f"model: {sum(n for _, n in frozen):,} of {total:,} parameters are frozen (requires_grad=False, "
            f"{len(frozen)} tensors, e.g. {frozen[0][0]}): they are not trained")


# ---------------------------------------------------------------- the data: first item and first batch

def _tensor_like(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, np.ndarray):
        return v.dtype.kind in "biuf"
    return isinstance(v, (numbers.Real, np.number)) and not isinstance(v, str)


def check_item(item: Any, index: int, names: Names = Names()) -> None:
    """One dataset item must be an (inputs, targets) pair of tensors (numbers and numpy arrays collate too)."""
    if isinstance(item, Mapping):  # data.name factories' dict items are mapped by data.datasets.map_dict_items
        from turbotrain.data.datasets import dict_item_keys

        keys = dict_item_keys(item, names.data, index)  # one line naming the keys when they do not map
        raise UserError(f"{names.data}: item {index} is a dict with keys {list(item)[:8]}; map it to (inputs, "
                        f"targets) = ({keys[0]!r}, {keys[1]!r}) with turbotrain.data.datasets.map_dict_items(dataset)")
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise UserError(f"{names.data}: item {index} is {_describe(item)}, not an (inputs, targets) pair; "
                        f"make the dataset's __getitem__ return `inputs, targets` (two tensors)")
    for part, v in zip(("inputs", "targets"), item):
        if not _tensor_like(v):
            raise UserError(f"{names.data}: the {part} of item {index} are {_describe(v)}; expected a tensor "
                            f"(or a number / numeric numpy array)")


def first_batch(ds: Dataset, device: torch.device, names: Names = Names(),
                split: str = "train", micro: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """The first two items as one batch on `device` (what workload.first_batch does), with the item and
    collation contract checked. Call after the sampler has refused an empty or too-small dataset."""
    from turbotrain.data.datasets import TensorDataset  # datasets imports this module

    if split != "train":
        names = Names(names.model, f"{names.data} ({split} split)", names.loss)

    idx = list(range(min(2, micro, len(ds))))  # micro-batch 1: the forward sees one item, as training will
    if isinstance(ds, TensorDataset):
        batch = ds.__getitems__(idx)
    else:
        items = [call_user(ds.__getitem__, f"{names.data}: __getitem__({i})", i) for i in idx]
        for i, item in enumerate(items):
            check_item(item, i, names)
        try:
            batch = default_collate(items)
        except (RuntimeError, TypeError, ValueError) as e:
            shapes = ", ".join(f"item {i}: ({_describe(it[0])}, {_describe(it[1])})" for i, it in enumerate(items))
            raise UserError(f"{names.data}: items cannot be batched together ({_first_line(e)}; {shapes}); every "
                            f"item's inputs, and its targets, need the same shape and dtype (token sequences: pad "
                            f"every item to one length, e.g. tokenizer(..., padding='max_length'), -100 in the "
                            f"labels' padding)") from None
    if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not all(isinstance(t, torch.Tensor) for t in batch):
        raise UserError(f"{names.data}: a batch is {_describe(batch)}, not (inputs, targets) tensors")
    for part, t in zip(("inputs", "targets"), batch):
        if t.is_meta:  # shapes without values: nothing to copy to the device or train on
            raise UserError(f"{names.data}: the items' {part} are tensors on the meta device (a shape, no data); "
                            f"return tensors that hold values (on the CPU)")
        if t.requires_grad:  # an autograd graph built once in the dataset: the second backward through it fails
            raise UserError(f"{names.data}: the items' {part} require grad (they hang on an autograd graph); "
                            f"return detached tensors (tensor.detach()) from the dataset")
    return tuple(t.to(device) for t in batch)


def check_same_items(train: tuple, val: tuple, names: Names = Names()) -> None:
    """The validation split's items must have the train split's per-item shapes and dtypes (the model is
    checked on the train split only; a val split that differs would fail at the end of the run)."""
    def sig(batch):
        return [(tuple(t.shape[1:]), str(t.dtype).removeprefix("torch.")) for t in batch]

    if sig(train) != sig(val):
        show = lambda s: ", ".join(f"{list(shape)} {dtype}" for shape, dtype in s)  # noqa: E731
        raise UserError(f"{names.data}: the validation items are ({show(sig(val))}) per (inputs, targets), the "
                        f"training items ({show(sig(train))}); give both splits the same shapes and dtypes")


# ---------------------------------------------------------------- model × data: the first forward and loss

class _Mismatch(Exception):
    """Raised from a layer's forward pre-hook: the layer's input does not fit the layer."""


def _layer_problem(name: str, mod: nn.Module, inp: torch.Tensor) -> str | None:
    """What is wrong with `inp` as the input of layer `name`, checked before the layer runs (on a GPU an
    out-of-range embedding index is a device-side assert that ruins the process, not an exception)."""
    label = f"layer `{name or type(mod).__name__}` ({type(mod).__name__}"
    # an Embedding subclass with a forward of its own (BART's learned positions take the input ids and index
    # by position) is not indexed by its input
    if isinstance(mod, nn.Embedding) and type(mod).forward is nn.Embedding.forward and not inp.is_floating_point() \
            and inp.numel():
        lo, hi = int(inp.min()), int(inp.max())
        if lo < 0 or hi >= mod.num_embeddings:
            bad = hi if hi >= mod.num_embeddings else lo
            return (f"{label} of {mod.num_embeddings} rows) is given index {bad}; "
                    f"indices must be 0..{mod.num_embeddings - 1}")
    weight = getattr(mod, "weight", None)
    if isinstance(weight, nn.parameter.UninitializedParameter):  # lazy layers take any size
        return None
    if isinstance(mod, nn.Linear) and inp.dim() >= 1 and inp.shape[-1] != mod.in_features:
        return (f"{label}) expects {mod.in_features} input features, "
                f"its input has {inp.shape[-1]} (shape {tuple(inp.shape)})")
    if isinstance(mod, nn.modules.conv._ConvNd):
        d = len(mod.kernel_size)
        if inp.dim() in (d + 1, d + 2) and inp.shape[-(d + 1)] != mod.in_channels:
            return (f"{label}) expects {mod.in_channels} input channels, its input has {inp.shape[-(d + 1)]} "
                    f"(shape {tuple(inp.shape)})")
    return None


def _builtin_model(model: nn.Module) -> bool:
    return type(model).__module__.startswith("turbotrain.models.")


def _model_key(model: nn.Module, arg: str) -> str:
    return f"model.args.{arg}" if _builtin_model(model) else f"the model's {arg}"


def check_declared(model: nn.Module, x: torch.Tensor, names: Names) -> None:
    """The sizes a built-in model declares as attributes (vocab_size, block_size, in_channels, in_features,
    image_size) against the batch. User models are checked layer by layer in the forward instead (an
    attribute of theirs with one of these names may mean something else)."""
    if not _builtin_model(model):
        return
    who = f"{names.model} does not fit {names.data}"
    vocab, block = getattr(model, "vocab_size", None), getattr(model, "block_size", None)
    if not x.is_floating_point() and x.numel():
        if isinstance(block, int) and x.dim() >= 2 and x.shape[1] > block:
            raise UserError(f"{who}: the data's sequences are {x.shape[1]} tokens long, but "
                            f"{_model_key(model, 'block_size')} = {block}; raise it to >= {x.shape[1]} or shorten "
                            f"the data's sequences (data.args.seq_len / data.args.block_size)")
        lo, hi = int(x.min()), int(x.max())
        if isinstance(vocab, int) and (hi >= vocab or lo < 0):
            raise UserError(f"{who}: the data has token id {hi if hi >= vocab else lo}, but "
                            f"{_model_key(model, 'vocab_size')} = {vocab} (ids 0..{vocab - 1}); raise it to at "
                            f"least the data's vocabulary (data.args.vocab_size), or leave it out to take the data's")
    if x.is_floating_point() and x.dim() >= 2:
        ch, feat, size = (getattr(model, k, None) for k in ("in_channels", "in_features", "image_size"))
        if isinstance(ch, int) and x.dim() >= 3 and x.shape[1] != ch:
            raise UserError(f"{who}: the data's images have {x.shape[1]} channels (shape {tuple(x.shape[1:])}), but "
                            f"{_model_key(model, 'in_channels')} = {ch}; make them agree")
        if isinstance(feat, int) and x[0].numel() != feat:
            raise UserError(f"{who}: the data's inputs have {x[0].numel()} features (shape {tuple(x.shape[1:])}), "
                            f"but {_model_key(model, 'in_features')} = {feat}; make them agree")
        if isinstance(size, int) and x.dim() == 4 and tuple(x.shape[2:]) != (size, size):
            raise UserError(f"{who}: the data's images are {x.shape[2]}x{x.shape[3]}, the model takes "
                            f"{size}x{size} images")


def fused_loss_problem(model: nn.Module, ds: Dataset, names: Names = Names()) -> str | None:
    """Why the fused loss cannot stand in for this model's forward + cross-entropy (the rest of a
    `kernels.fused_loss = true ...` line), or None. Names alone do not make the protocol: on the first item
    (eval mode, no grad, RNG and modes left as they were) `hidden(inputs)` must run, fit `head`, and
    `head(hidden(inputs))` must be `forward(inputs)`; else the run would train a model other than the user's."""
    from turbotrain.models.structure import supports_fused_loss

    if not supports_fused_loss(model) or any(p.is_meta for p in model.parameters()) or not len(ds):
        return None  # no hidden/head: the resolver says so; built on meta: a built-in; empty: refused later
    x, y = first_batch(ds, torch.device("cpu"), names, micro=1)
    if _declares_sequence(model, x, y):
        x = x[:, :PREFIX]
    modes = [(m, m.training) for m in model.modules()]
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            out, h = model(x), model.hidden(x)
            if not isinstance(h, torch.Tensor) or h.shape[-1] != model.head.in_features:
                got = tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
                return (f"needs `hidden(inputs)` to give the head's input ({model.head.in_features} features last); "
                        f"{names.model}'s gave {got}; set kernels.fused_loss=false")
            fused = model.head(h)
            if not isinstance(out, torch.Tensor) or out.shape != fused.shape or not torch.allclose(
                    out.float(), fused.float(), rtol=1e-3, atol=1e-3):
                return (f"replaces forward(inputs) by head(hidden(inputs)), which differ for {names.model} on the "
                        "first item; make forward return head(hidden(inputs)) or set kernels.fused_loss=false")
    except Exception as e:  # noqa: BLE001 - the user's hidden() failing is a reason, said in the line
        return (f"calls {names.model}'s hidden(inputs), which failed on the first item ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:120] if str(e) else ''}); set kernels.fused_loss=false")
    finally:
        for m, training in modes:
            m.training = training
    return None


PREFIX = 8  # tokens per sequence in the check's forward, for built-in models that declare vocab_size and block_size


def _declares_sequence(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> bool:
    return (_builtin_model(model) and isinstance(getattr(model, "vocab_size", None), int)
            and isinstance(getattr(model, "block_size", None), int)
            and not x.is_floating_point() and x.dim() == 2 and y.dim() == 2 and x.shape[1] > PREFIX
            and y.shape[1] == x.shape[1])


def _builtin_loss(loss_fn: Callable | None) -> str | None:
    if loss_fn is None:
        return None
    if getattr(loss_fn, "__module__", None) in ("turbotrain.losses", "turbotrain.trainer") and \
            getattr(loss_fn, "__name__", None) in ("cross_entropy", "mse"):
        return loss_fn.__name__
    return None


def _check_targets(kind: str | None, model: nn.Module, out: torch.Tensor, y: torch.Tensor, names: Names,
                   y_full: torch.Tensor | None = None) -> int | None:
    """The built-in losses' expectations of (output, targets), checked before the loss runs (an
    out-of-range class index is, again, a device-side assert on a GPU). `y_full`: all the targets, when
    `y` is the prefix the forward ran on. Returns the number of classes for cross-entropy, else None."""
    if kind is not None and not out.is_floating_point():  # mse would drop a complex output's imaginary part
        raise UserError(f"{names.loss}: the output of {names.model} is {_describe(out)}; {kind} needs a floating-point "
                        f"output (an integer or bool one has no gradient, a complex one is not a real value); "
                        f"return float logits or values")
    if kind == "cross_entropy":
        if y.is_floating_point() or y.dtype == torch.bool:
            raise UserError(f"{names.loss} needs integer class labels, {names.data} gives {_describe(y)} as "
                            f"targets; use train.loss = \"mse\" for regression targets, or return int64 labels")
        if out.dim() == 0 or out.numel() // max(out.shape[-1], 1) != y.numel():
            raise UserError(f"{names.loss}: the output of {names.model} is {_describe(out)}, the targets are "
                            f"{_describe(y)}; cross_entropy needs logits (..., classes) for labels (...)")
        check_labels(y if y_full is None else y_full, out.shape[-1], model, names)
        return out.shape[-1]
    elif kind == "mse" and out.numel() != y.numel():
        raise UserError(f"{names.loss}: the output of {names.model} is {_describe(out)}, the targets are "
                        f"{_describe(y)}; mse compares them element by element, so they need the same size")
    return None


IGNORE_INDEX = -100  # F.cross_entropy's (and the fused loss's) label for a position that does not count


def check_labels(labels: torch.Tensor, classes: int, model: nn.Module, names: Names, at: str = "") -> None:
    """Class labels must be 0..classes-1, or -100 for a position the loss ignores (padding, as in PyTorch and
    Hugging Face). `at`: where the labels came from when not the first batch ("at step 12: ")."""
    labels = labels[labels != IGNORE_INDEX]
    if not labels.numel():
        return
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0:
        raise UserError(f"{at}{names.data} has label {lo}: class labels are 0..{classes - 1}, or -100 for a "
                        f"position the loss ignores; fix the labels")
    if hi >= classes:
        arg = "vocab_size" if isinstance(getattr(model, "vocab_size", None), int) else "num_classes"
        raise UserError(f"{at}{names.data} has label {hi}, {names.model} outputs {classes} classes (labels "
                        f"0..{classes - 1}); raise {_model_key(model, arg)} to at least the data's number of "
                        f"classes, or fix the labels")


def check_later_batch(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], classes: int | None,
                      names: Names, step: int) -> None:
    """A batch after the first whose step failed inside torch: the first batch's data checks again, on a CPU
    copy, so that a bad item later in the data is named as such (not a traceback). `classes`: what the first
    batch's cross-entropy check saw, None where it did not apply."""
    at = f"at step {step}: "
    x, y = (t.detach().cpu() for t in batch)
    try:
        check_declared(model, x, names)
    except UserError as e:
        raise UserError(f"{at}{e}") from None
    if not x.is_floating_point() and x.numel():
        rows = max((m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)), default=None)
        hi, lo = int(x.max()), int(x.min())
        if rows is not None and (hi >= rows or lo < 0):
            raise UserError(f"{at}{names.data} has input id {hi if hi >= rows else lo}, past {names.model}'s "
                            f"embeddings ({rows} rows, ids 0..{rows - 1}); fix the data or enlarge the vocabulary")
    if classes is not None and not y.is_floating_point():
        check_labels(y, classes, model, names, at)


def nonfinite_part(batch: tuple[torch.Tensor, torch.Tensor]) -> str | None:
    """"inputs" or "targets" when that part of the batch holds NaN/inf (floating parts only), else None."""
    for part, t in zip(("inputs", "targets"), batch):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return part
    return None


def check_loss_value(loss: Any, who: str) -> None:
    """What a step does with the loss — divide, backward, accumulate into a 0-dim tensor — needs a
    floating 0-dim tensor attached to the model's parameters."""
    if not isinstance(loss, torch.Tensor):
        raise UserError(f"{who} returned {_describe(loss)}, not a tensor; return a 0-dim torch tensor computed "
                        f"from the model's output (a Python number cannot be backpropagated)")
    if loss.dim() != 0:
        raise UserError(f"{who} returned {_describe(loss)}, not a scalar; reduce it to one number "
                        f"(e.g. .mean() over the batch)")
    if not loss.is_floating_point():
        raise UserError(f"{who} returned {_describe(loss)}; a loss must be a floating-point tensor")
    if not loss.requires_grad:
        raise UserError(f"{who} returned a loss that does not depend on the model's trainable parameters "
                        f"(detached, or built from .item() / numbers); "
                        f"compute it from the model's output with torch ops")


def check_eval_value(v: Any, who: str, loss: bool) -> None:
    """Evaluation runs the model in eval mode under no_grad, a path the train-mode checks of the first batch
    did not take: the model's output must be a tensor, a loss a one-number floating-point tensor."""
    if not isinstance(v, torch.Tensor) or (loss and (v.numel() != 1 or not v.is_floating_point())):
        want = "a one-number floating-point tensor" if loss else "the output tensor"
        raise UserError(f"evaluation: in eval mode {who} returned {_describe(v)}; return {want}, as in training "
                        f"(eval mode: model.eval() under torch.no_grad())")


def metric_value(v: Any, who: str, device: torch.device) -> torch.Tensor:
    """An eval metric's value for one batch as a float64 0-dim tensor on `device`: a Python/numpy number or a
    one-element numeric tensor (read without a host sync); anything else is one UserError naming the metric."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.dtype != torch.bool and not v.is_complex():
        return v.detach().reshape(()).to(device=device, dtype=torch.float64)
    if isinstance(v, (numbers.Real, np.number)) and not isinstance(v, (bool, np.bool_)):
        return torch.tensor(float(v), dtype=torch.float64, device=device)
    raise UserError(f"{who} returned {_describe(v)}; an eval metric returns one number per batch "
                    f"(a float or a one-element tensor), e.g. reduce it with .mean()")


def _hint(model: nn.Module, x: torch.Tensor) -> str:
    p = next((p for p in model.parameters() if p.is_floating_point()), None)
    if p is None:
        return ""
    if x.is_floating_point() and x.dtype != p.dtype and not torch.is_autocast_enabled(x.device.type):
        return (f"; the inputs are {str(x.dtype)[6:]}, the model's weights {str(p.dtype)[6:]}: "
                f"return {str(p.dtype)[6:]} inputs")
    if not x.is_floating_point() and x.dim() == 3 and x.shape[1] == 1:  # tokenizer(text, return_tensors="pt")
        return ("; each item's inputs are a batch of one row (1, length), as tokenizer(..., return_tensors='pt') "
                "gives: return the row (enc['input_ids'][0]), or tokenize without return_tensors")
    if not x.is_floating_point() and not any(isinstance(m, nn.Embedding) for m in model.modules()):
        kind = "complex numbers" if x.is_complex() else "integers"
        return f"; the inputs are {str(x.dtype)[6:]} ({kind}) and the model has no embedding: return float inputs"
    return ""


def _size_hooks(model: nn.Module) -> list:
    """Pre-forward hooks on the sized layers: a mismatch is named at the layer, before it runs (an embedding
    index out of range would otherwise be a device-side assert on a GPU)."""
    def pre_hook(name):
        def hook(mod, args):
            inp = args[0] if args else None
            problem = _layer_problem(name, mod, inp) if isinstance(inp, torch.Tensor) else None
            if problem:
                raise _Mismatch(problem)
        return hook

    return [mod.register_forward_pre_hook(pre_hook(name)) for name, mod in model.named_modules()
            if isinstance(mod, (nn.Embedding, nn.Linear, nn.modules.conv._ConvNd))]


def _first_forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable | None, names: Names):
    try:
        return model(x) if loss_fn is not None else own_loss(model(x, y))
    except _Mismatch as e:
        raise UserError(f"{names.model} does not fit {names.data} (inputs {_describe(x)}): {e}; "
                        f"make the model's input sizes match the data") from None
    except (torch.OutOfMemoryError, MemoryError, UserError):
        raise
    except Exception as e:  # any exception of the user's forward or loss is theirs to fix
        how = "forward(inputs, targets) (train.loss = \"model\")" if loss_fn is None else "forward(inputs)"
        raise UserError(f"{names.model} fails on the first batch of {names.data} (inputs {_describe(x)}, "
                        f"targets {_describe(y)}) in {how}: {type(e).__name__}: {_first_line(e)}"
                        f"{_hint(model, x)}") from e


def _first_loss(model: nn.Module, out, y: torch.Tensor, y_full: torch.Tensor, loss_fn: Callable,
                names: Names) -> int | None:
    if not isinstance(out, torch.Tensor):
        raise UserError(f"{names.model}: forward returned {_describe(out)}, not a tensor; return the output "
                        f"tensor (e.g. logits), or set train.loss = \"model\" and return the loss from "
                        f"forward(inputs, targets)")
    classes = _check_targets(_builtin_loss(loss_fn), model, out, y, names, y_full)
    try:
        loss = loss_fn(out, y)
    except (torch.OutOfMemoryError, MemoryError, UserError):
        raise
    except Exception as e:  # any exception of the user's forward or loss is theirs to fix
        raise UserError(f"{names.loss} fails on the output of {names.model} ({_describe(out)}) and the "
                        f"targets of {names.data} ({_describe(y)}): {type(e).__name__}: {_first_line(e)}") from e
    check_loss_value(loss, names.loss)
    return classes


def _refuse_copy_task(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable | None,
                      names: Names) -> None:
    """HF's causal-LM labels (labels = input_ids, which the HF model shifts itself) under the built-in
    cross-entropy: output t would be trained to predict token t, which it sees, so the run would learn to copy
    its input and report a near-zero loss and a near-perfect val_acc."""
    from turbotrain.models.hf import labels_are_inputs

    causal = getattr(model, "causal", None) is True or (
        _builtin_model(model) and isinstance(getattr(model, "vocab_size", None), int)
        and isinstance(getattr(model, "block_size", None), int))
    if causal and _builtin_loss(loss_fn) == "cross_entropy" and x.dim() >= 2 and labels_are_inputs(x, y):
        raise UserError(f"{names.data}: the targets equal the inputs (HF's causal-LM labels = input_ids), so "
                        f"{names.loss} would train {names.model} to copy its input; set train.loss = \"model\" for an "
                        f"HF causal LM (it shifts the labels), or give targets shifted by one (y[t] = x[t + 1])")


def _check_targets_parameter(model: nn.Module, names: Names) -> None:
    """train.loss = "model" calls forward(inputs, targets) positionally: an HF-style forward(input_ids,
    attention_mask=None, labels=None) would take the targets as its mask and compute no loss from them."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # a builtin or C-implemented forward: nothing to read
        return
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    targets = ("labels", "label", "targets", "target", "y")
    label = next((n for n in targets if n in positional[2:]), None)
    if label and positional[1] not in targets:
        shown = ", ".join(positional[:3]) + ", ..." * (len(positional) > 3)
        raise UserError(f"{names.model}: train.loss = \"model\" calls forward(inputs, targets) with the targets as "
                        f"the second argument, which forward({shown}) takes as {positional[1]!r}, not {label!r}; "
                        f"make {label!r} the second parameter")


def check_model_data(model: nn.Module, sample: tuple[torch.Tensor, torch.Tensor], loss_fn: Callable | None,
                     names: Names = Names()) -> int | None:
    """The first forward and the first loss on `sample` (from `first_batch`), as a training step runs them
    (loss_fn None: `train.loss = "model"`, forward(inputs, targets) returns the loss). Run once at build
    time, before the model is wrapped or compiled; leaves no trace (RNG state, BatchNorm statistics and
    gradients as before). Raises one UserError naming the model, the data and the loss. Returns the number
    of classes the built-in cross-entropy saw (for `check_later_batch`), else None."""
    x, y = sample
    check_declared(model, x, names)
    _refuse_copy_task(model, x, y, loss_fn, names)
    if loss_fn is None:
        _check_targets_parameter(model, names)
    y_full = y
    if _declares_sequence(model, x, y):  # ids and length checked above: a short prefix shows the rest
        x, y = x[:, :PREFIX], y[:, :PREFIX]  # (GPT-2 124M on 2x1024 tokens would take seconds on a CPU)
    hooks, buffers = _size_hooks(model), [(b, b.detach().clone()) for b in model.buffers()]
    devices = [x.device] if x.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            out = _first_forward(model, x, y, loss_fn, names)
            for h in hooks:
                h.remove()
            hooks.clear()
            if loss_fn is None:
                check_loss_value(out, f"{names.model} with train.loss = \"model\": its forward(inputs, targets)")
                return None
            return _first_loss(model, out, y, y_full, loss_fn, names)
    finally:
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)

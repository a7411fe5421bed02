"""Built-in models (`gpt`, `llama`, `cnn`, `resnet`, `mlp`), Hugging Face models (`hf:<model_type>`, `hf:/saved/dir`:
see models/hf.py) and user factories (`pkg.module:build`, which may return an HF model too)."""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

from torch import jit as torch_jit
from torch import nn

from turbotrain.errors import UserError
from turbotrain.log import say
from turbotrain.models import hf
from turbotrain.plugins import call_factory, is_import_spec, load_object

BUILTIN = ("gpt", "llama", "cnn", "resnet", "mlp")


@dataclass
class ModelConfig:
    """The `[model]` section."""

    name: str = "gpt"
    """"gpt" | "llama" | "cnn" | "resnet" | "mlp" | "hf:<model_type>" (args: the HF config's) | "hf:/saved/dir" |
    "pkg.module:factory" (build(**args) -> nn.Module)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the model factory; data-derived ones (vocab_size, ...) are filled in and recorded."""

    def __post_init__(self) -> None:
        if hf.is_hf_name(self.name):
            hf.check_name(self.name)
        elif self.name not in BUILTIN and not is_import_spec(self.name):
            raise UserError(f"model.name = {self.name!r}: expected one of {', '.join(BUILTIN)}, 'hf:<model_type>', "
                            f"'hf:/saved/dir' or 'pkg.module:factory'")


def model_factory(cfg: ModelConfig):
    """The callable behind `model.name`: a built-in's `build` or the user's `pkg.module:factory`."""
    if hf.is_hf_name(cfg.name):
        return functools.partial(hf.build_hf, cfg.name)
    if is_import_spec(cfg.name):
        factory = load_object(cfg.name, "model.name")
        if isinstance(factory, nn.Module):  # callable, but calling it runs its forward
            raise UserError(f"model.name = {cfg.name!r} names a built {type(factory).__name__} module, not a factory; "
                            "name a function (or class) that builds and returns the model")
        return factory
    return importlib.import_module(f"turbotrain.models.{cfg.name}").build


def args_from_data(cfg: ModelConfig, meta: dict) -> dict:
    """The data-derived arguments (vocab_size, num_classes, ...) that the factory takes and the config
    leaves out; the resolver records them in the run's config.toml so the model can be rebuilt from it."""
    if hf.is_hf_name(cfg.name):
        return hf.data_args(cfg.name, meta, cfg.args)
    params = inspect.signature(model_factory(cfg)).parameters
    return {k: v for k, v in meta.items() if k in params and k not in cfg.args}


def estimate_params(cfg: ModelConfig) -> int | None:
    """A built-in or `hf:<model_type>` model's parameter count from its arguments, before anything is allocated
    (None for other models, and for arguments the builder will refuse with its own message)."""
    if hf.is_hf_name(cfg.name):
        return hf.estimate_params(cfg.name, cfg.args)
    if cfg.name not in BUILTIN:
        return None
    module = importlib.import_module(f"turbotrain.models.{cfg.name}")
    if not hasattr(module, "estimate_params"):
        return None
    try:
        bound = inspect.signature(module.build).bind(**cfg.args)
        bound.apply_defaults()
        return int(module.estimate_params(**bound.arguments))
    except (TypeError, ValueError, ArithmeticError):
        return None


def build_model(cfg: ModelConfig) -> nn.Module:
    """Build on the CPU from `model.name` and `model.args`. Usage: `build_model(cfg.model)`."""
    if hf.is_hf_name(cfg.name):
        return hf.build_hf(cfg.name, cfg.args)
    with hf.quiet_torchao_import():  # a factory building an HF model imports its classes: no log lines on stderr
        model = call_factory(model_factory(cfg), "model.args", **cfg.args)
    model = adapt(model)
    if not isinstance(model, nn.Module):
        raise UserError(f"model.name = {cfg.name!r}: the factory returned {type(model).__name__}, not an nn.Module")
    check_initialised(model, f"model.name = {cfg.name!r}")
    return model


def check_initialised(model: nn.Module, who: str) -> None:
    """Refuses a model holding a module whose __init__ never ran nn.Module.__init__ (no super().__init__()):
    it has no parameter or submodule tables, so the first .parameters() or .to() fails inside torch with an
    AttributeError naming neither the class nor the fix. Walked by hand, as named_modules() itself needs them."""
    stack, seen = [("", model)], set()
    while stack:
        name, mod = stack.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        if isinstance(mod, torch_jit.ScriptModule):  # a traced module keeps its tables in its C++ module
            continue
        tables = vars(mod)
        if not all(t in tables for t in ("_parameters", "_buffers", "_modules")):
            cls = type(mod).__name__
            part = f"its module `{name}` ({cls})" if name else f"the model ({cls})"
            raise UserError(f"{who}: {part} was never initialised as an nn.Module: {cls}.__init__ does not call "
                            f"super().__init__(); call it first thing in {cls}.__init__, before setting any attribute")
        stack.extend((f"{name}.{k}" if name else k, m) for k, m in tables["_modules"].items() if m is not None)


def adapt(model: nn.Module) -> nn.Module:
    """A `transformers` model under turbotrain's contract (`models.hf.HFModel`: .logits / .loss read from its
    output, labels by keyword); a `torch.compile`d, DataParallel or DistributedDataParallel one (a script's
    or Accelerate's wrapping) as the module inside it, an Accelerate-prepared one with its own forward; any
    other model as it is. Usage: `model = adapt(user_model)`."""
    if not isinstance(model, nn.Module):  # refused by the caller, naming what it is
        return model
    inner = getattr(model, "_orig_mod", None)
    if type(model).__name__ == "OptimizedModule" and isinstance(inner, nn.Module):
        # its state names carry `_orig_mod.`, which final/ leaves out, and turbotrain's own compile
        # (compile.enabled) wraps the model with the loss, which a compiled model inside would split
        say("model: it came compiled (torch.compile); turbotrain trains the module inside it and compiles as "
            "compile.enabled says")
        return adapt(inner)
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        # its forward passes arguments on positionally (an HF model inside would take the targets as its
        # cache) and its state names carry `module.`; turbotrain wraps the model itself (parallel.strategy)
        say(f"model: it came wrapped in {type(model).__name__}; turbotrain trains the module inside it and "
            f"parallelises as parallel.strategy says")
        return adapt(model.module)
    if all(callable(getattr(type(model), k, None)) for k in ("training_step", "configure_optimizers")):
        # a LightningModule (read from the class: its properties raise outside a Trainer) is an nn.Module
        say(f"warning: model: {type(model).__name__} has Lightning's training_step and configure_optimizers, which "
            f"turbotrain does not call: it trains forward(inputs) against train.loss (or forward(inputs, targets) "
            f"returning the loss, train.loss = \"model\") with train.optimizer")
    if "_original_forward" in vars(model):  # Accelerate's prepare: forward patched to run under its autocast
        _unpatch_forward(model)
    return hf.HFModel(model) if hf.is_hf_model(model) else model


def _unpatch_forward(model: nn.Module) -> None:
    """The forward the model had before `accelerator.prepare` (mixed_precision) wrapped it in autocast, which
    would run under precision.dtype = "fp32" too; turbotrain applies precision.dtype itself."""
    original = vars(model).pop("_original_forward")
    if getattr(original, "__func__", None) is type(model).forward:
        vars(model).pop("forward", None)  # the class's own forward again
    else:
        model.forward = original
    say("model: it came prepared by Accelerate (forward wrapped in its autocast); turbotrain runs the model's own "
        "forward, under precision.dtype")

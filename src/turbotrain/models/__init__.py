"""Built-in models (`gpt`, `cnn`, `resnet`, `mlp`) and user factories (`pkg.module:build`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from turbotrain.errors import UserError
from turbotrain.plugins import call_factory, is_import_spec, load_object

BUILTIN = ("gpt", "cnn", "resnet", "mlp")


@dataclass
class ModelConfig:
    name: str = "gpt"
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in BUILTIN and not is_import_spec(self.name):
            raise UserError(f"model.name = {self.name!r}: expected one of {', '.join(BUILTIN)} or 'pkg.module:factory'")


def build_model(cfg: ModelConfig, **defaults: Any) -> nn.Module:
    """Build on the CPU; `defaults` (e.g. vocab_size from the data) fill args the config leaves out."""
    if is_import_spec(cfg.name):
        factory = load_object(cfg.name, "model.name")
    else:
        import importlib

        factory = importlib.import_module(f"turbotrain.models.{cfg.name}").build
    import inspect

    params = inspect.signature(factory).parameters
    args = {k: v for k, v in defaults.items() if k in params and k not in cfg.args}
    args.update(cfg.args)
    model = call_factory(factory, "model.args", **args)
    if not isinstance(model, nn.Module):
        raise UserError(f"model.name = {cfg.name!r}: the factory returned {type(model).__name__}, not an nn.Module")
    return model

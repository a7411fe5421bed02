"""torch.compile, whole model or per block, with the compile time measured and an eager fallback.

Compilation is lazy: it happens in the first forward/backward. The trainer therefore times the first
step as compile time and, when that step raises a compiler error, calls `disable_compile` and redoes the
step eagerly, printing the reason once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import nn

from turbotrain.monitor.log import say

Mode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


@dataclass
class CompileConfig:
    enabled: bool = False
    mode: Mode = "default"
    scope: Literal["model", "blocks"] = "model"
    fullgraph: bool = False
    backend: str = "inductor"  # any torch.compile backend ("aot_eager" to debug a compile problem)
    coordinate_descent_tuning: bool = False  # inductor tunes pointwise/reduction launch configs (slower compile)


class WithLoss(nn.Module):
    """model + loss as one module, so `scope="model"` compiles the loss into the same graph as the head
    (no fp32 logits round trip through memory)."""

    def __init__(self, model: nn.Module, loss_fn: Callable | None):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is None:
            return self.model(x, y)
        return self.loss_fn(self.model(x), y)


def find_blocks(model: nn.Module) -> nn.ModuleList | nn.Sequential | None:
    """The repeated blocks of a model: `model.blocks` if present, else its longest ModuleList/Sequential."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        return blocks
    lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1]
    return max(lists, key=len, default=None)


def apply_compile(module: nn.Module, cfg: CompileConfig, blocks_of: nn.Module | None = None) -> list[nn.Module]:
    """Compile in place (nn.Module.compile keeps state_dict keys clean) and return the compiled modules.

    scope="model": `module` (the model with its loss) becomes one graph, so the loss fuses with the head.
    scope="blocks": each repeated block of `blocks_of` is compiled alone (regional compile): one graph
    reused by every block, so compile time stays flat as depth grows.
    """
    if not cfg.enabled:
        return []
    kwargs: dict = dict(fullgraph=cfg.fullgraph, backend=cfg.backend)
    if cfg.backend == "inductor":  # modes are inductor's options
        kwargs["mode"] = cfg.mode
        if cfg.coordinate_descent_tuning:
            import torch._inductor.config as inductor_config

            inductor_config.coordinate_descent_tuning = True
    if cfg.scope == "model":
        targets = [module]
    else:
        blocks = find_blocks(blocks_of if blocks_of is not None else module)
        if blocks is None:
            say("compile: scope=blocks but the model has no repeated blocks; compiling the whole model")
            targets = [module]
        else:
            targets = list(blocks)
    for m in targets:
        m.compile(**kwargs)
    return targets


def is_compile_error(exc: BaseException) -> bool:
    """Errors raised by dynamo/inductor (as opposed to errors of the model's own code)."""
    mod = type(exc).__module__ or ""
    return mod.startswith(("torch._dynamo", "torch._inductor")) or isinstance(
        exc, torch._dynamo.exc.TorchDynamoException
    )


def disable_compile(compiled: list[nn.Module], exc: BaseException) -> None:
    """Fall back to eager for every compiled module, saying why once."""
    root = exc
    while getattr(root, "inner_exception", None) or root.__cause__:  # the compiler's own error, not dynamo's wrapper
        root = getattr(root, "inner_exception", None) or root.__cause__
    text = str(root).strip()
    reason = f"{type(root).__name__}: {text.splitlines()[0][:300] if text else ''}"
    say(f"compile: failed ({reason}); falling back to eager")
    for m in compiled:
        m._compiled_call_impl = None
    torch._dynamo.reset()


def compile_stats() -> dict:
    """Graph breaks and recompiles seen so far (dynamo's counters), for the summary."""
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    return {
        "graph_breaks": int(breaks),
        "graph_break_reasons": sorted(counters["graph_break"])[:5],
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "recompiles": int(sum(v for k, v in counters["recompiles"].items())) if "recompiles" in counters else 0,
    }

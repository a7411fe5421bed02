"""torch.compile, whole model or per block, with the compile time measured and an eager fallback.

Compilation is lazy: it happens in the first forward/backward. The trainer therefore times the first
step as compile time and, when that step raises a compiler error, calls `disable_compile` and redoes the
step eagerly, printing the reason once (with compile.fullgraph = true the error ends the run instead).
"""
from __future__ import annotations

import difflib
import json
import typing
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from turbotrain.log import say
from turbotrain.models.structure import find_blocks

Mode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


@dataclass
class CompileConfig:
    """The `[compile]` section."""

    enabled: bool = False
    """torch.compile the model (compile time is measured apart; a compiler error falls back to eager)."""
    mode: Mode = "default"
    """Inductor mode; "reduce-overhead" adds CUDA graphs (one process only: they cannot hold DDP/FSDP collectives)."""
    scope: Literal["model", "blocks"] = "model"
    """"model": one graph with the loss fused to the head; "blocks": each repeated block alone (regional compile)."""
    fullgraph: bool = False
    """Fail instead of breaking the graph."""
    backend: str = "inductor"
    """Any torch.compile backend ("aot_eager" to debug a compile problem)."""
    coordinate_descent_tuning: bool = False
    """Inductor tunes pointwise/reduction launch configs (slower compile)."""
    inductor: dict = field(default_factory=dict)
    """Inductor settings for this compile by their `torch._inductor.config` names, e.g.
    {"triton.mix_order_reduction" = false}; a name this torch lacks, or a value of another type, is an error."""
    cache: bool = True
    """Keep inductor's, Triton's and torch's portable compile caches in `cache_dir`: later runs start warm."""
    cache_dir: str = ""
    """Compile cache folder, copyable to other nodes ("": $TURBOTRAIN_CACHE/compile or ~/.cache/turbotrain/compile);
    trust it like code: torch unpickles what it loads from there."""

    def __post_init__(self) -> None:
        from turbotrain.errors import UserError

        if self.cache_dir != self.cache_dir.strip():  # "  " would be a folder of spaces in the working directory
            raise UserError(f"compile.cache_dir = {self.cache_dir!r}: leading or trailing spaces; remove them "
                            "(\"\" = the default folder)")
        _check_inductor_settings(self.inductor)
        if self.backend == "inductor":
            return
        from torch._dynamo import list_backends  # the live registry: backends registered at run time count

        known = list_backends(exclude_tags=())
        if self.backend not in known:
            close = difflib.get_close_matches(self.backend, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            shown = [b for b in known if "TESTING" not in b]
            raise UserError(f"compile.backend = {self.backend!r}: not a registered torch.compile backend; {hint}"
                            f"available: {', '.join(shown)}")


def apply_compile(module: nn.Module, cfg: CompileConfig, blocks_of: nn.Module | None = None) -> list[nn.Module]:
    """Compile in place (nn.Module.compile keeps state_dict keys clean) and return the compiled modules.

    scope="model": `module` (the model with its loss) becomes one graph, so the loss fuses with the head.
    scope="blocks": each repeated block of `blocks_of` is compiled alone (regional compile): one graph
    reused by every block, so compile time stays flat as depth grows.
    """
    if not cfg.enabled:
        return []
    from torch._dynamo.utils import counters

    counters.clear()  # process-wide: a second run in one process (the Python API) would report the first's too
    kwargs: dict = dict(fullgraph=cfg.fullgraph, backend=cfg.backend)
    if cfg.backend == "inductor":
        kwargs["options"] = inductor_options(cfg)
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
        m.turbotrain_fullgraph = cfg.fullgraph  # read by disable_compile: a fullgraph compile must fail, not fall back
    return targets


def inductor_options(cfg: CompileConfig) -> dict:
    """torch.compile's `options` for this config: the mode's own settings, then ours. Passed per compile
    (torch takes `mode` or `options`, not both), so nothing leaks into the process's other compiles."""
    from torch._inductor import list_mode_options

    extra = {"coordinate_descent_tuning": True} if cfg.coordinate_descent_tuning else {}
    return {**list_mode_options(cfg.mode), **extra, **cfg.inductor}


def has_inductor_setting(name: str) -> bool:
    """Whether this torch's inductor has a setting of that name."""
    from torch._inductor import config as inductor_config

    return name in inductor_config.get_config_copy()


def _check_inductor_settings(settings: dict) -> None:
    """Each name exists in this torch's inductor config and its value has that setting's type (as torch.compile
    checks it, a bool no number; an int is taken for a float, a TOML list for a tuple)."""
    if not settings:
        return
    from torch._inductor import config as inductor_config

    from turbotrain.errors import UserError

    known = inductor_config.get_config_copy()
    for name, value in list(settings.items()):
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserError(f"compile.inductor: torch {torch.__version__} has no inductor setting {name!r}; {hint}"
                            "remove it (compile.inductor={} drops a preset's settings)")
        get_type = getattr(inductor_config, "get_type", None)
        want = get_type(name) if get_type else type(known[name])
        if want is float and type(value) is int:
            settings[name] = value = float(value)
        if (typing.get_origin(want) or want) is tuple and isinstance(value, list):
            settings[name] = value = tuple(value)
        if not isinstance(want, type) or want is type(None):  # a generic or optional type: torch checks no further
            continue
        if not isinstance(value, want) or (type(value) is bool and want is not bool):
            raise UserError(f"compile.inductor.{json.dumps(name)} = {value!r}: expected {want.__name__} "
                            f"(inductor's default is {known[name]!r})")


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
    if any(getattr(m, "turbotrain_fullgraph", False) for m in compiled):  # asked to fail rather than run otherwise
        from turbotrain.errors import UserError

        raise UserError(f"compile.fullgraph = true: torch.compile could not compile the model as one graph "
                        f"({reason}); remove what it names (a graph break), or set compile.fullgraph = false "
                        f"to let the graph break (or fall back to eager)") from None
    say(f"compile: failed ({reason}); falling back to eager")
    for m in compiled:
        m._compiled_call_impl = None
    torch._dynamo.reset()


def compile_stats() -> dict:
    """Graph breaks, recompiles and compile-cache hits seen so far (dynamo's and inductor's counters), for
    the summary. A warm start shows FX-graph cache hits and no misses."""
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    return {
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "aot_autograd_cache_hit": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "aot_autograd_cache_miss": int(counters["aot_autograd"]["autograd_cache_miss"]),
        "graph_breaks": int(breaks),
        "graph_break_reasons": sorted(counters["graph_break"])[:5],
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "recompiles": int(sum(v for k, v in counters["recompiles"].items())) if "recompiles" in counters else 0,
    }

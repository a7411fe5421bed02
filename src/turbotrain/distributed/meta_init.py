"""Meta-device initialisation (`parallel.meta_init`): the model is built with its parameters on the meta
device (shapes, no storage), sharded by FSDP2 or wrapped, then materialised on the target device
(`to_empty`) and initialised there, so a model larger than the host or one GPU never exists whole.

Initialisation, in this order of preference:
- the model's seeded hook `init_weights(seed=...)` (the built-in models): every parameter drawn on the host
  in chunks of rows seeded by (run seed, parameter name, chunk), a rank drawing only its shard's chunks
  (models/init.py), so a meta build, a full-size build and any sharding give the same values, and peak host
  memory is one chunk;
- a user model's own `init_weights()` (no arguments), else torch's convention: `reset_parameters()` of every
  module that has one. Each rank draws its own shard's values, so these differ from a full-size build's.

Buffers (BatchNorm statistics, RoPE caches...) are not put on the meta device: they are built for real (they
are small), kept across `to_empty` (which leaves storage uninitialised) and copied back.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from turbotrain.errors import UserError
from turbotrain.log import say

BUILTIN_HOOK = "init_weights"  # built-in models: init_weights(seed: int), drawn by models/init.py


def wanted(setting: str | bool, strategy: str, model_name: str, builtin: tuple[str, ...]) -> bool:
    """Whether to build `model_name` on the meta device: "auto" for built-in models under fsdp/hsdp; true for
    any model the config builds except Hugging Face ones (from_pretrained's weights would be lost)."""
    from turbotrain.distributed.parallel import SHARDED

    if setting == "auto":
        return strategy in SHARDED and model_name in builtin
    if setting and model_name.startswith("hf:"):
        raise UserError(f"parallel.meta_init = true with model.name = {model_name!r}: Hugging Face models load or "
                        "initialise their own weights on the CPU; set parallel.meta_init = false")
    return bool(setting)


@contextlib.contextmanager
def params_on_meta(active: bool = True) -> Iterator[None]:
    """While active, every parameter a module registers is moved to the meta device at once (the CPU tensor
    it was created from is freed: at most one parameter exists on the host at a time); buffers stay real.
    A parameter already on meta (a tied weight) is kept as it is, so ties survive."""
    if not active:
        yield
        return
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if isinstance(param, nn.parameter.UninitializedParameter):  # it has no shape until a forward sees data
            raise UserError(f"parallel.meta_init = true: {type(self).__name__} has the lazy parameter {name!r} "
                            "(nn.Lazy* modules take their sizes from the first forward, which runs only after "
                            "materialising); give the module its sizes (e.g. nn.Linear for nn.LazyLinear) or set "
                            "parallel.meta_init = false")
        register(self, name, param)
        p = self._parameters.get(name)
        if p is not None and not p.is_meta:
            self._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def materialize(model: nn.Module, device: torch.device, seed: int) -> str:
    """Storage on `device` for every parameter (its shard where sharded) and buffer, then the initialisation;
    returns which initialisation ran (for the log)."""
    if not callable(getattr(model, BUILTIN_HOOK, None)):
        _check_resettable(model)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers() if not b.is_meta}
    ties = _tied(model)
    model.to_empty(device=device)
    for slots in ties:  # to_empty gives each module its own new tensor: tie them again to the first one's
        first = getattr(*slots[0])
        for m, name in slots[1:]:
            setattr(m, name, first)
    with torch.no_grad():
        for name, saved in buffers.items():
            model.get_buffer(name).copy_(saved)
    how = initialise(model, seed, fresh=True)
    say(f"meta_init: built on the meta device, materialised on {device}, initialised by {how}")
    return how


def _check_resettable(model: nn.Module) -> None:
    """Without an `init_weights()` hook, `reset_parameters()` of each module is all that sets the storage
    `to_empty` leaves uninitialised: a parameter held by a module without one (an `nn.Parameter` of the model's
    own) or a buffer built on the meta device would train on whatever memory held."""
    params = [f"{mod}.{name}".lstrip(".") for mod, m in model.named_modules()
              for name, _ in m.named_parameters(recurse=False) if not callable(getattr(m, "reset_parameters", None))]
    buffers = [name for name, b in model.named_buffers() if b.is_meta]
    if params or buffers:
        what = (f"parameters no reset_parameters() sets ({', '.join(params[:4])})" if params else
                f"buffers built on the meta device ({', '.join(buffers[:4])}), which nothing restores")
        raise UserError(f"parallel.meta_init = true: the model has {what}; give the model an init_weights() method "
                        "that initialises everything (it runs after materialising), or set parallel.meta_init = false")


@contextlib.contextmanager
def buffers_on_meta(model: nn.Module) -> Iterator[None]:
    """Every buffer swapped for a meta tensor of its shape while the block runs (a FLOP count of a meta model:
    shapes only, no real buffer meeting a meta parameter), the real ones put back after."""
    real = [(m, name, b) for m in model.modules() for name, b in m._buffers.items() if b is not None]
    for m, name, b in real:
        m._buffers[name] = b.to("meta")
    try:
        yield
    finally:
        for m, name, b in real:
            m._buffers[name] = b


def _tied(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The (module, attribute) slots of each parameter held by more than one slot (a tied head)."""
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in model.modules():
        for name, p in m.named_parameters(recurse=False):
            slots.setdefault(id(p), []).append((m, name))
    return [s for s in slots.values() if len(s) > 1]


def initialise(model: nn.Module, seed: int, fresh: bool) -> str | None:
    """The seeded hook where the model has one. fresh=True (after to_empty) falls back to the model's own
    `init_weights()` or every module's `reset_parameters()`; fresh=False (a full-size build, already
    initialised by its constructor) leaves such models alone. Returns what ran (None: nothing)."""
    hook = getattr(model, BUILTIN_HOOK, None)
    if callable(hook) and "seed" in inspect.signature(hook).parameters:
        hook(seed=seed)
        return f"{type(model).__name__}.{BUILTIN_HOOK}(seed={seed})"
    if not fresh:
        return None
    if callable(hook):
        hook()
        return f"{type(model).__name__}.{BUILTIN_HOOK}()"
    names = sorted({type(m).__name__ for m in model.modules() if callable(getattr(m, "reset_parameters", None))})
    for m in model.modules():
        if callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()
    return f"reset_parameters() of {', '.join(names) or 'no module'}"


class HostPeak:
    """Peak host memory growth of this process from its creation (in `prepare`: until the model is built,
    sharded and initialised; the first forward's gathers are the step's memory, not the build's): the kernel's
    high-water mark (VmHWM, reset through /proc/self/clear_refs where allowed) less the resident size at the
    start. Linux only; elsewhere the figures are None."""

    def __init__(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS to the current RSS
        except OSError:
            pass  # then VmHWM may include an earlier peak: the growth is overstated, never understated
        self.start_kb = _status_kb("VmRSS")

    def growth_mb_per_rank(self) -> list[float | None]:
        """Every rank's growth in MiB (a collective under torch.distributed; [own] in one process)."""
        peak = _status_kb("VmHWM")
        mine = round((peak - self.start_kb) / 1024, 1) if peak is not None and self.start_kb is not None else None
        if not (dist.is_available() and dist.is_initialized()):
            return [mine]
        out: list = [None] * dist.get_world_size()
        dist.all_gather_object(out, mine)
        return out


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_host_bytes() -> int | None:
    """The kernel's estimate of memory available without swapping (/proc/meminfo MemAvailable; None elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None

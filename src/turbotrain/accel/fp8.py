"""FP8 training through torchao's float8: the model's large nn.Linear layers become `Float8Linear`, whose
matmuls (forward, grad-input, grad-weight) run on FP8 tensor cores with dynamic scales; weights, gradients and
optimizer state stay as they were (fp32 masters under bf16 autocast).

Recipes (`precision.fp8`): "tensorwise" (one scale a tensor: fastest; under FSDP2 the weights are all-gathered
in FP8, half of bf16's bytes) and "rowwise" (one scale a row: closer to bf16's accuracy; slower by torchao's
own tables).
"""
from __future__ import annotations

import re
from typing import Callable

import torch
from torch import nn

from turbotrain.errors import UserError
from turbotrain.log import say
from turbotrain.models.structure import output_layer

FP8_CAPABILITY = (8, 9)  # Ada (sm89) and Hopper (sm90) have FP8 tensor cores


def require_torchao(recipe: str) -> None:
    """Refuse at config time, not mid-run, when torchao's float8 is not importable."""
    from turbotrain.models.hf import quiet_torchao_import

    try:
        with quiet_torchao_import():
            import torchao.float8  # noqa: F401
    except ImportError as e:
        raise UserError(f"precision.fp8 = {recipe!r}: needs torchao ({e}); pip install turbotrain[fp8], "
                        f"or set precision.fp8 = 'off'") from None


def check_fp8(recipe: str, device: torch.device, dtype: str) -> None:
    """The resolver's rule: FP8 needs an FP8-capable NVIDIA GPU, bf16 autocast (torchao's float8 matmuls
    take and return bf16) and torchao. Usage: `check_fp8(cfg.precision.fp8, device, resolved_dtype)`."""
    if recipe == "off":
        return
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < FP8_CAPABILITY:
        raise UserError(f"precision.fp8 = {recipe!r}: needs an NVIDIA GPU with FP8 (sm89+, e.g. H100); "
                        f"set precision.fp8 = 'off'")
    if dtype != "bf16":
        raise UserError(f"precision.fp8 = {recipe!r}: needs precision.dtype = \"bf16\" (or \"auto\"), not "
                        f"{dtype!r}; set precision.fp8 = 'off' for other dtypes")
    require_torchao(recipe)


def fp8_shape_error(exc: BaseException) -> UserError | None:
    """The one-line error for FP8's shape rule, or None when `exc` is something else. FP8 matmuls need every
    dimension a multiple of 16; the filter guarantees it for the layers' widths, but the rows — the tokens
    of a micro-batch (batch × sequence length) — are the data's: the grad-weight matmul fails on them in the
    first backward (torch._scaled_mm's check eager, its meta function's when compile traces)."""
    text, e = "", exc
    while e is not None:  # compile wraps the kernel's own error
        text += str(e)
        e = getattr(e, "inner_exception", None) or e.__cause__
    found = re.search(r"divisible by 16,? but got ([^\n]+?)\.?(?:\n|$)", text)
    if found is None:
        return None
    return UserError(f"precision.fp8: FP8 matmuls need the rows reaching each linear layer (micro-batch x sequence "
                     f"length) to be a multiple of 16 (torch: got {found[1]}); choose data.batch_size and the "
                     f"sequence length so, or set precision.fp8 = 'off'")


def fp8_filter(recipe: str, head: nn.Module | None, skip_weights: set[int]) -> Callable[[nn.Module, str], bool]:
    """Which nn.Linear layers to convert: torchao's size filter for the recipe (dims divisible by 16, and
    large enough that the FP8 matmul outruns bf16 plus the cost of the casts, by torchao's H100 tables),
    minus those whose weight is in `skip_weights` (ids of weights tied to an embedding: Float8Linear would
    re-wrap the weight and untie it) and the output layer, which is `head` when asked (dims divisible by 16
    the only rule there: an explicit ask)."""
    from torchao.float8 import _auto_filter_for_recipe

    by_size = _auto_filter_for_recipe(recipe, filter_fqns=[])

    def keep(module: nn.Module, fqn: str) -> bool:
        if head is not None and module is head:
            return True
        return id(module.weight) not in skip_weights and by_size(module, fqn)
    return keep


def apply_fp8(model: nn.Module, recipe: str, fsdp: bool, head: bool = False) -> int:
    """Swap the model's large linears for torchao's Float8Linear, in place; returns how many were swapped.
    The output layer stays as it is unless `head` (precision.fp8_head). Under FSDP2 with "tensorwise",
    weights are all-gathered in FP8 (torchao's float8 all-gather).
    Usage: `apply_fp8(model, "rowwise", fsdp=False)`."""
    if recipe == "off":
        return 0
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if fsdp and recipe == "tensorwise":  # the tensorwise recipe (torchao's defaults) + FP8 all-gather
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    tied = _embedding_weights(model)
    out = output_layer(model)
    if head:
        _check_head(out, tied, config.enable_fsdp_float8_all_gather)
    total = sum(isinstance(m, nn.Linear) for m in model.modules())
    skip = tied | ({id(out.weight)} if out is not None else set())  # the head: bf16 unless asked
    linears = {id(m.weight): m for m in model.modules() if type(m) is nn.Linear}
    convert_to_float8_training(model, module_filter_fn=fp8_filter(recipe, out if head else None, skip),
                               config=config)
    swapped = [m for m in model.modules() if type(m).__name__ == "Float8Linear"]
    for m in swapped:  # the layer it replaced (same parameters), for remove_fp8; not a submodule of it
        object.__setattr__(m, "turbotrain_linear", linears.get(id(m.weight)))
    n = len(swapped)
    say(f"fp8: {recipe} scaling on {n} of {total} linear layers, the output head "
        f"{'included' if head else 'kept in bf16'} (the rest too small to gain, or tied)")
    return n


def remove_fp8(model: nn.Module) -> None:
    """The user's own nn.Linear layers back where apply_fp8 swapped in Float8Linear (they hold the same, trained
    parameters): a Python API caller's model after the run computes as they built it, and their next run with
    precision.fp8 = "off" is not FP8. A layer whose weight FSDP2's FP8 all-gather rewrapped stays as it is."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            linear = getattr(child, "turbotrain_linear", None)
            if linear is not None and linear.weight is child.weight and linear.bias is child.bias:
                setattr(parent, name, linear)


def head_convertible(model: nn.Module, fsdp_fp8_gather: bool) -> bool:
    """Would precision.fp8_head be accepted on this built model (`tune` asks before it tries it)?"""
    try:
        _check_head(output_layer(model), _embedding_weights(model), fsdp_fp8_gather)
    except UserError:
        return False
    return True


def _embedding_weights(model: nn.Module) -> set[int]:
    """Ids of the embeddings' weights: a linear sharing one is tied to it."""
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def _check_head(out: nn.Module | None, tied: set[int], fsdp_fp8_gather: bool) -> None:
    """precision.fp8_head's refusals, found on the built model."""
    if out is None:
        raise UserError("precision.fp8_head = true: the model has no output layer to convert (a top-level `head` "
                        "nn.Linear or transformers' get_output_embeddings()); set precision.fp8_head=false")
    n, k = out.weight.shape
    if n % 16 or k % 16:
        raise UserError(f"precision.fp8_head = true: FP8 matmuls need the head's dimensions to be multiples of 16, "
                        f"it is {k} -> {n}; pad the vocabulary to a multiple of 16 or set precision.fp8_head=false")
    if fsdp_fp8_gather and id(out.weight) in tied:
        raise UserError("precision.fp8_head = true: under FSDP2 the tensorwise recipe all-gathers weights in FP8 "
                        "through a weight wrapper, which would untie the head from the embedding; set "
                        "precision.fp8_head=false, or precision.fp8=\"rowwise\"")


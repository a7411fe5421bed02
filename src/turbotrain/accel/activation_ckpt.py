"""Activation checkpointing per block: trade recompute in backward for activation memory.

"full": a block keeps only its input; everything inside is recomputed in backward.
"selective": op-level policy — outputs of matmuls and attention (expensive to redo) are saved, cheap
pointwise/normalization ops are recomputed. Less memory than none, less recompute than full.
Results are unchanged either way (tested); only backward FLOPs and memory move. The eager recompute runs the block
in training mode again, so the block's buffers (BatchNorm's running statistics, a user's counters) are put back as
the forward left them (a compiled graph recomputes without its buffer writes).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from turbotrain.errors import UserError
from turbotrain.models.structure import find_blocks


@dataclass
class MemoryConfig:
    """The `[memory]` section: activation checkpointing (here) and channels_last (accel/memory_format.py)."""

    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Recompute block activations in backward: less memory, more compute; results unchanged."""
    channels_last: bool | Literal["auto"] = "auto"
    """NHWC layout for convnets ("auto": on for models with Conv2d on a GPU)."""

_aten = torch.ops.aten
_SAVE_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten.linear.default,
    _aten.convolution.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}
if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _SAVE_OPS.add(_aten._scaled_dot_product_flash_attention_for_cpu.default)


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(block: nn.Module, own_forward, mode: str, *args, **kwargs):
    # a forward the block's instance had of its own (a library's hook), else its class's looked up at each call:
    # a rewrite that swaps the block's class later (kernels.convnet) or gives torch's back is what runs
    block_forward = own_forward or functools.partial(type(block).forward, block)
    forward = block_forward
    if any(getattr(m, "inplace", False) is True for m in block.modules()):
        def forward(*a, **k):  # on copies of the inputs: an in-place layer may write the block's input, which
            # the recompute reads again
            return block_forward(*(t.clone() if isinstance(t, torch.Tensor) else t for t in a), **k)

    if torch.compiler.is_compiling():  # the graph's recompute leaves buffers alone; only torch's SAC contexts trace
        if mode == "selective":
            ctx = functools.partial(create_selective_checkpoint_contexts, _policy)
            return checkpoint(forward, *args, use_reentrant=False, context_fn=ctx, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    def contexts():
        fwd, recompute = (create_selective_checkpoint_contexts(_policy) if mode == "selective"
                          else (contextlib.nullcontext(), contextlib.nullcontext()))
        return fwd, _buffers_kept(block, recompute)

    return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)


@contextlib.contextmanager
def _buffers_kept(block: nn.Module, inner):
    """The recompute inside `inner`, the block's buffers restored after it: a second training-mode forward must
    not update BatchNorm's running statistics (or any state the block keeps) a second time."""
    saved = [(b, b.detach().clone()) for b in block.buffers()]
    try:
        with inner:
            yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> int:
    """Wrap each repeated block's forward (instance attribute, so state_dict keys stay unchanged).
    Returns the number of blocks wrapped. Usage: `apply_activation_checkpointing(model, "full")`."""
    if mode == "none":
        return 0
    blocks = find_blocks(model)
    if blocks is None:
        raise UserError(
            "memory.activation_checkpointing needs a model with repeated blocks (a `blocks` ModuleList); "
            "set memory.activation_checkpointing=\"none\""
        )
    wrapped = list({id(block): block for block in blocks}.values())  # a block listed twice is wrapped once
    remove_activation_checkpointing(model)  # wrapped once, however many runs the model goes through
    for block in wrapped:
        block.forward = functools.partial(_checkpointed, block, block.__dict__.get("forward"), mode)
    return len(wrapped)


def remove_activation_checkpointing(model: nn.Module) -> None:
    """`model` as it was before apply_activation_checkpointing (a user's model given back after a run)."""
    for m in model.modules():
        while isinstance(wrapper := m.__dict__.get("forward"), functools.partial) and wrapper.func is _checkpointed:
            if wrapper.args[1] is None:
                del m.forward
            else:
                m.forward = wrapper.args[1]


def checkpointed_blocks(model: nn.Module) -> int:
    """How many of `model`'s modules run under a checkpoint wrapper."""
    return sum(1 for m in model.modules() if isinstance(m.__dict__.get("forward"), functools.partial)
               and m.__dict__["forward"].func is _checkpointed)

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
from turbotrain.models import gelu_epilogue, packed_attention
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
_SAVE_OPS.add(packed_attention.QKV_ATTENTION_OP)  # kernels.packed_attention
_SAVE_OPS.update(gelu_epilogue.SAVE_OPS)  # kernels.gelu_epilogue


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def recomputes_in_graph(backend: str) -> bool:
    """Whether torch.compile's `backend` recomputes a checkpointed region as part of its graph (AOTAutograd's
    partitioner: no second buffer write, the forward's dropout masks). Any other backend (dynamo's "eager", "ts", a
    user's) reruns dynamo's graph of the block under torch's checkpoint with no RNG state kept: BatchNorm's
    statistics written twice (an autograd error) and new dropout masks in the recompute (wrong gradients)."""
    from torch._dynamo import lookup_backend
    from torch._dynamo.backends.common import AotAutograd

    if backend in ("inductor", "cudagraphs") or backend.startswith("aot_"):
        return True
    try:
        return isinstance(lookup_backend(backend), AotAutograd)
    except Exception:  # not registered (yet): CompileConfig names it; the safe side is outside the graph
        return False


def _checkpointed(block: nn.Module, own_forward, mode: str, outside, *args, **kwargs):
    # a forward the block's instance had of its own (a library's hook), else its class's looked up at each call:
    # a rewrite that swaps the block's class later (kernels.convnet) or gives torch's back is what runs
    block_forward = own_forward or functools.partial(type(block).forward, block)
    forward = block_forward
    if any(getattr(m, "inplace", False) is True for m in block.modules()):
        def forward(*a, **k):  # on copies of the inputs: an in-place layer may write the block's input, which
            # the recompute reads again
            return block_forward(*(t.clone() if isinstance(t, torch.Tensor) else t for t in a), **k)

    if torch.compiler.is_compiling() and outside is not None:  # the block leaves the graph, checkpointed below
        return outside(block, own_forward, mode, outside, *args, **kwargs)
    if torch.compiler.is_compiling():  # the graph's recompute leaves buffers alone; only torch's SAC contexts trace
        if mode == "selective":
            ctx = functools.partial(create_selective_checkpoint_contexts, _policy)
            return checkpoint(forward, *args, use_reentrant=False, context_fn=ctx, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    def contexts():
        fwd, recompute = (create_selective_checkpoint_contexts(_policy) if mode == "selective"
                          else (contextlib.nullcontext(), contextlib.nullcontext()))
        return fwd, _buffers_kept(block, recompute)

    return checkpoint(_input_kept(block, forward), *args, use_reentrant=False, context_fn=contexts, **kwargs)


def _input_kept(block: nn.Module, forward):
    """`forward`, refusing a block that writes over its input in place (`x += ...`, `x.mul_(...)`): checkpointing
    keeps that input to rerun the block in backward, and autograd would find it changed (a traceback)."""
    def run(*a, **k):
        tensors = [t for t in a if isinstance(t, torch.Tensor)]
        versions = [t._version for t in tensors]
        out = forward(*a, **k)
        if torch.is_grad_enabled() and any(t._version != v for t, v in zip(tensors, versions)):  # eval: no recompute
            raise UserError(f"memory.activation_checkpointing: a {type(block).__name__} block writes over its input "
                            "in place (e.g. `x += ...` or `x.mul_(...)` on the block's argument), which checkpointing "
                            "keeps to recompute the block in backward; make it out of place (x = x + ...), or set "
                            "memory.activation_checkpointing=\"none\"")
        return out
    return run


@functools.cache
def _outside_graph():
    """_checkpointed as dynamo's graph break: it runs the block on the eager path. Built on first use (importing
    dynamo takes seconds)."""
    return torch.compiler.disable(_checkpointed)


@contextlib.contextmanager
def _buffers_kept(block: nn.Module, inner):
    """The recompute inside `inner`, the block's buffers restored after it: a second training-mode forward must
    not update BatchNorm's running statistics (or any state the block keeps) a second time."""
    saved = [(b, b.detach().clone()) for b in block.buffers()]
    try:
        with inner:
            yield
    except RuntimeError as e:
        if "selective activation checkpoint has been mutated" not in str(e):
            raise
        raise UserError(f"memory.activation_checkpointing = \"selective\": a {type(block).__name__} block writes in "
                        "place over a matmul or convolution output that selective checkpointing keeps for backward "
                        "(e.g. nn.ReLU(inplace=True) after nn.Linear, or `y += x` on a linear's output); set "
                        "memory.activation_checkpointing=\"full\", or make that operation out of place") from None
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def apply_activation_checkpointing(model: nn.Module, mode: str, compile_backend: str = "inductor") -> int:
    """Wrap each repeated block's forward (instance attribute, so state_dict keys stay unchanged); `compile_backend`
    is the torch.compile backend the blocks will run under, if any. Returns the number of blocks wrapped.
    Usage: `apply_activation_checkpointing(model, "full")`."""
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
    outside = None if recomputes_in_graph(compile_backend) else _outside_graph()
    for block in wrapped:
        block.forward = functools.partial(_checkpointed, block, block.__dict__.get("forward"), mode, outside)
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

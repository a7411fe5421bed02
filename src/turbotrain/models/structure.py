"""What turbotrain needs to know about a model's structure: its repeated blocks (the unit of activation
checkpointing, per-block compile and FSDP2 sharding) and the model + loss pair that a step calls; and what the ops
of our own share (their on/off switch, their tensors' GPU made current)."""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Callable

import torch
from torch import nn


@contextlib.contextmanager
def op_switch(state: dict, enabled: bool, name: str):
    """`state["on"]` is `enabled` inside the block and given back after: the switch of an op models opt into
    (packed attention, the GELU epilogue). It takes only a resolved bool: "auto" or "false" must not read as on."""
    if not isinstance(enabled, int):  # bool is an int
        raise TypeError(f"{name}(enabled) takes True or False, not {enabled!r} (an unresolved \"auto\" is off: "
                        "model_ops(kernels) enters the resolved setting)")
    before = state["on"]
    state["on"] = bool(enabled)
    try:
        yield
    finally:
        state["on"] = before


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """The tensors' GPU current inside the block, whichever is current outside: cuBLASLt handles and Triton
    launches take the current device and its stream."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class WithLoss(nn.Module):
    """model + loss as one module, so `scope="model"` compiles the loss into the same graph as the head
    (no fp32 logits round trip through memory). With `fused_loss` the model's head and the cross-entropy run
    as one chunked op on the model's final hidden states (`supports_fused_loss`), never building the logits:
    `fused_loss(model.hidden(x), model.head.weight, y)` (accel.fused_loss.fused_linear_cross_entropy; passed in,
    as accel depends on models)."""

    def __init__(self, model: nn.Module, loss_fn: Callable | None, fused_loss: Callable | None = None):
        super().__init__()
        self.model, self.loss_fn, self.fused_loss = model, loss_fn, fused_loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.fused_loss is not None:
            return self.fused_loss(self.model.hidden(x), self.model.head.weight, y)
        if self.loss_fn is None:
            return own_loss(self.model(x, y))
        return self.loss_fn(self.model(x), y)


def own_loss(out: Any) -> Any:
    """The loss of forward(inputs, targets) under train.loss = "model": the tensor returned, or where a training
    loop of HF Trainer or Accelerate reads it: out["loss"] of a dict (a ModelOutput is one), out.loss, or the first
    of a tuple (transformers' return_dict=False order). Anything else is returned as it is, for the contract's
    check to name."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping) and "loss" in out:
        return out["loss"]
    if isinstance(getattr(out, "loss", None), torch.Tensor):  # before a tuple's first: a namedtuple (logits, loss)
        return out.loss
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


def compute_params(linear: nn.Module, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of `linear` in `dtype` for its GEMM: the bf16 copies a layer carries where they are of that
    dtype (`weight_copy`, `bias_copy`: accel/weight_copies.py), else casts of its own, as autocast would. A copied
    weight's gradient is its copy's; a bias's goes to the float32 bias (its sum over the tokens keeps float32)."""
    copy = getattr(linear, "weight_copy", None)
    if copy is not None and copy.dtype == dtype:
        return copy, None if linear.bias is None else _CastUp.apply(linear.bias, linear.bias_copy)
    return linear.weight.to(dtype), None if linear.bias is None else linear.bias.to(dtype)


class _CastUp(torch.autograd.Function):
    """The bf16 copy forward; its gradient to the float32 parameter, cast up (autocast's cast backward)."""

    @staticmethod
    def forward(ctx, param: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(torch.float32), None


def supports_fused_loss(model: nn.Module) -> bool:
    """The fused-loss protocol: `hidden(idx)` gives the final-normed hidden states (B, T, D) and `head` is a
    bias-free nn.Linear (weight possibly tied), with forward(idx) == head(hidden(idx))."""
    head = getattr(model, "head", None)
    return (callable(getattr(model, "hidden", None)) and isinstance(head, nn.Linear) and head.bias is None)


def output_layer(model: nn.Module) -> nn.Linear | None:
    """The model's output projection (the LM head): a top-level `head` nn.Linear (turbotrain's models), else
    what a transformers model's `get_output_embeddings()` returns (found inside turbotrain's HF wrapper too)."""
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        return head
    for m in model.modules():
        get = getattr(m, "get_output_embeddings", None)
        out = get() if callable(get) else None
        if isinstance(out, nn.Linear):
            return out
    return None


def find_blocks(model: nn.Module) -> nn.ModuleList | nn.Sequential | None:
    """The repeated blocks of a model: `model.blocks` if present, else its longest ModuleList/Sequential."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        return blocks
    lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1]
    return max(lists, key=len, default=None)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP and the loss wrapper: checkpoints are the same for every strategy."""
    model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return model.model if isinstance(model, WithLoss) else model


def model_class_name(model: nn.Module) -> str:
    """The model's own class as `module.qualname`, past the subclass FSDP2's fully_shard swaps in (FSDPGPT)."""
    from torch.distributed.fsdp import FSDPModule

    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    return f"{cls.__module__}.{cls.__qualname__}"

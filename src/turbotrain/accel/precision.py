"""Mixed precision: autocast dtype, TF32 switch and the fp16 GradScaler.

Master weights stay fp32: autocast casts per op, so parameters and optimizer state never leave fp32.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Literal

import torch

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "auto"]
Fp8 = Literal["off", "rowwise", "tensorwise"]


@dataclass
class PrecisionConfig:
    """The `[precision]` section."""

    dtype: Dtype = "auto"
    """Autocast dtype: "auto" (bf16 on GPUs that have it, fp16 on older ones, fp32 on CPU) | fp32 | tf32 | bf16 |
    fp16 (with loss scaling)."""
    fp8: Fp8 = "off"
    """FP8 matmuls for the large linear layers through torchao (`pip install turbotrain[fp8]`; sm89+ GPU, bf16):
    "off" | "tensorwise" (fastest; FP8 all-gather under FSDP2) | "rowwise" (closer to bf16's accuracy)."""
    fp8_head: bool = False
    """Also the output layer (LM head, tied or not) in FP8; kept in bf16 by default, as torchao and its users do.
    A large-vocabulary head is much of the FLOPs (llama-1b: 21 % of its linears'); kernels.fused_loss "auto" turns
    off for it (the fused loss computes the head in bf16), an explicit true is an error."""
    weight_copies: bool | Literal["auto"] = "auto"
    """bf16 copies of the linear layers' weights, written by the Triton AdamW kernel as it steps the float32 ones:
    the forward reads them instead of autocast casting every weight each step, and their bf16 gradients reach the
    kernel without a cast (autocast's values; checkpoints keep the float32 weights). Needs bf16,
    train.optimizer_impl "triton", train.grad_accum = 1 and one process (bf16 gradients summed over micro-batches or
    ranks would round where autocast's float32 ones do not), no FP8. "auto": on wherever those hold."""


def resolve_dtype(name: str, device: torch.device) -> str:
    """Turn "auto" into a concrete choice: bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU
    (CPU autocast to bf16 is slower than fp32 on most CPUs); bf16 asked on a GPU without it becomes fp16."""
    if device.type == "cuda" and name in ("auto", "bf16"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if name == "auto":
        return "fp32"
    return name


def autocast_dtype(name: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)


def apply_tf32(name: str) -> None:
    """TF32 matmuls for everything but strict fp32: under bf16/fp16 autocast the few fp32 matmuls left
    (e.g. ops autocast keeps in fp32) gain from it too."""
    on = name != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


@contextlib.contextmanager
def tf32_kept():
    """The process's TF32 settings as they were before a run (`apply_tf32` sets them process-wide): a Python API
    caller's own float32 work after `train()` must not run in TF32 because the run's precision was bf16."""
    b = torch.backends
    try:  # torch raises on reading these once the caller mixed its legacy and fp32_precision APIs
        matmul, cudnn = torch.get_float32_matmul_precision(), b.cudnn.allow_tf32
        knobs, saved = [], []
    except RuntimeError:  # that caller's settings are put back through the newer API, which reads them all
        knobs = [b.cuda.matmul, b.cudnn.conv, b.cudnn.rnn]
        saved = [k.fp32_precision for k in knobs]
    try:
        yield
    finally:
        if knobs:
            for knob, value in zip(knobs, saved):
                knob.fp32_precision = value
        else:
            torch.set_float32_matmul_precision(matmul)
            b.cudnn.allow_tf32 = cudnn


def autocast(name: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward-pass context: `with autocast("bf16", device): loss = model(x)`."""
    dtype = autocast_dtype(name)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def build_scaler(name: str, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling only for fp16 (bf16 has fp32's range); disabled scalers are no-ops in the step."""
    return torch.amp.GradScaler(device.type, enabled=(name == "fp16"))

"""bf16 copies of the linear layers' weights, kept by the optimizer (`precision.weight_copies`).

Under bf16 autocast every step casts each linear's float32 weight and bias to bf16 before its GEMM, and casts each
bf16 weight gradient back to float32 for the optimizer: two kernels per tensor per step, each a launch plus a read
and a write. Here each trainable, unshared nn.Linear carries a bf16 copy of its weight and bias
(non-persistent buffers: checkpoints hold the float32 weights as before); the forward reads the copies, their bf16
gradients go to the Triton AdamW kernel as they are, and the kernel writes the new copies as it steps the float32
weights (accel/triton_adamw.py). The values are autocast's own: round-to-nearest bf16 of the float32 weight, and
the same bf16 gradient that autocast would cast up. Exact only with one micro-batch a step in one process
(accumulating or all-reducing bf16 gradients would round where autocast's float32 ones do not): the resolver turns
it on only there. A bias's gradient is a sum over the tokens that the compiler keeps in float32 under autocast: it
goes to the float32 bias (models/structure.compute_params), the cast fused into the sum. (A layer called more than
once a forward sums its bias's gradients in float32, where autocast sums their bf16 values before the cast.)

The optimizer owns the pairing: `TritonAdamW.sync_copies()` (called before each forward) copies a float32 weight
that changed outside its step (a checkpoint load, an in-place edit: torch's version counter says so; after any
callback hook, which may write through `.data`: `forget`) and drops a copy's gradient left by a backward outside the
step. Outside bf16 autocast a layer reads its float32 weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakTensorKeyDictionary

from turbotrain.log import say_once
from turbotrain.models.structure import compute_params

DTYPE = torch.bfloat16
# each copy's weight's (version, address) when the copy was last written: torch's version counter moves on every
# in-place write through the parameter (a checkpoint load, an optimizer of torch's), but not on one through `.data`
_WRITTEN = WeakTensorKeyDictionary()


class CopiedLinear(nn.Linear):
    """nn.Linear whose forward under bf16 autocast reads `weight_copy` / `bias_copy` (bf16 buffers). A copy of the
    layer (`copy.deepcopy`, pickling: an EMA or evaluation twin, `torch.save(model)`) is a plain nn.Linear: no
    optimizer writes its copies."""

    carries_weight_copies = True  # models/structure.compute_params reads them for GEMMs of a model's own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if reads_copies(x):
            return F.linear(x, *compute_params(self, DTYPE))
        return F.linear(x, self.weight, self.bias)

    def __reduce_ex__(self, protocol):
        state = {k: v for k, v in self.__dict__.items() if k != "copies_of"}
        state["_buffers"] = {k: v for k, v in self._buffers.items() if k not in _NAMES}
        state["_non_persistent_buffers_set"] = self._non_persistent_buffers_set - set(_NAMES)
        return _plain_linear, (), state


_NAMES = ("weight_copy", "bias_copy")


def _plain_linear() -> nn.Linear:
    return nn.Linear.__new__(nn.Linear)


def reads_copies(x: torch.Tensor) -> bool:
    """Whether a layer's forward on `x` computes in the copies' dtype (bf16 autocast on x's device)."""
    kind = x.device.type
    return torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == DTYPE


def candidates(model: nn.Module, skip: nn.Module | None = None) -> list[nn.Linear]:
    """The linears that get copies: plain nn.Linear (not an FP8 or other converted one, whose own GEMM runs), float32
    trainable weight and bias held by no other module (a tied head's weight is the embedding's, read as float32
    there), plain tensors (not sharded DTensors); `skip`: a layer whose weight something else reads directly (the
    fused loss reads the head's)."""
    owners: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    found = []
    for m in model.modules():
        if type(m) is not nn.Linear or m is skip:
            continue
        ps = [p for p in (m.weight, m.bias) if p is not None]
        if all(type(p) is nn.Parameter and p.dtype == torch.float32 and p.requires_grad and owners[id(p)] == 1
               for p in ps):
            found.append(m)
    return found


@torch.no_grad()
def apply_weight_copies(model: nn.Module, enabled: bool, skip: nn.Module | None = None) -> int:
    """Give each candidate linear of `model` its bf16 copies (after the device move, before compile traces the
    forward). Returns how many layers got them."""
    if not enabled:
        return 0
    layers = candidates(model, skip)
    for m in layers:
        m.register_buffer("weight_copy", m.weight.detach().to(DTYPE).requires_grad_(), persistent=False)
        m.register_buffer("bias_copy", m.bias.detach().to(DTYPE) if m.bias is not None else None, persistent=False)
        m.__dict__["copies_of"] = (m.weight, m.bias)  # not registered: the parameters the copies are of
        m.__class__ = CopiedLinear
    return len(layers)


def remove_weight_copies(model: nn.Module) -> None:
    """The model's linears as they were (after a run, or a failed start)."""
    for m in model.modules():
        if isinstance(m, CopiedLinear):
            _plain(m)


def _plain(m: CopiedLinear) -> None:
    del m.weight_copy, m.bias_copy
    m.__dict__.pop("copies_of", None)
    m.__class__ = nn.Linear


def drop_replaced(model: nn.Module) -> None:
    """Before a forward: a layer whose weight or bias was replaced since its copies were made (`layer.weight =
    nn.Parameter(...)`, `load_state_dict(..., assign=True)`) reads its own float32 weights again, said once. The
    optimizer still steps the parameters it was built with, as torch's would."""
    for m in model.modules():  # every step: the names only where one is found
        if isinstance(m, CopiedLinear) and any(a is not b for a, b in zip(m.copies_of, (m.weight, m.bias))):
            name = next(n for n, x in model.named_modules() if x is m)
            _plain(m)
            say_once(f"warning: {name or 'the model'}'s weight or bias was replaced after the optimizer was built; "
                     "it reads its float32 weights (no bf16 copy), and the optimizer still steps the ones it was "
                     "built with: build the model's parameters before training")


def copies_of(model: nn.Module) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """(float32 parameter, its bf16 copy) for every copied weight and bias of `model`."""
    pairs = []
    for m in model.modules():
        if isinstance(m, CopiedLinear):
            pairs += [(p, c) for p, c in ((m.weight, m.weight_copy), (m.bias, m.bias_copy)) if c is not None]
    return pairs


def stale(p: torch.Tensor, copy: torch.Tensor) -> bool:
    """Whether `copy` may differ from bf16(`p`): `p` changed since the copy was written, or no write is known."""
    return _WRITTEN.get(copy) != (p._version, p.data_ptr())


def written(p: torch.Tensor, copy: torch.Tensor) -> None:
    _WRITTEN[copy] = (p._version, p.data_ptr())


def forget(model: nn.Module) -> None:
    """After code that may have written the model's weights through `.data` (a callback's hook): every copy is
    written again before the next forward."""
    for _, c in copies_of(model):
        _WRITTEN.pop(c, None)

"""A GELU MLP whose GELU and GELU gradient run in cuBLASLt's GEMM epilogues (`kernels.gelu_epilogue`).

`out(gelu(fc(x)))` costs, besides its four GEMMs, a GELU kernel in forward (read h, write gelu(h)) and a GELU
backward kernel (read the gradient and h, write dh). cuBLASLt can apply both in the epilogue of a GEMM that runs
anyway: the fc GEMM writes gelu(h) and h at once (GELU_AUX_BIAS), and the GEMM that makes the gradient of
gelu(h) writes dh instead (DGELU, h read beside its accumulator). The bias gradients and the other GEMMs stay with
torch (and inductor), so they fuse as before. Measured in benchmarks/NOTES.md (session 28).

The math is GPT-2's tanh GELU, as `F.gelu(approximate="tanh")`; the epilogue applies it to the fp32 accumulator
before rounding (torch rounds h to bf16 first), a difference within bf16's own rounding.

Models opt in by calling `gelu_mlp(x, fc, out)` where they would write `out(F.gelu(fc(x), approximate="tanh"))`
and naming the two linears (`calls_gelu_mlp = ("fc", "out")`, attribute names; turbotrain's GPT blocks do). It
runs the epilogue ops while `gelu_epilogue(True)` is in force, on CUDA tensors of bf16/fp16 (autocast's or their
own), for plain nn.Linear layers with biases and sizes that are multiples of 8; the plain expression otherwise, so
the model is the same model everywhere. The ops are `torch.library.custom_op`s with fake implementations and
autograd registered on them: they trace under `torch.compile(fullgraph=True)`, and CUDA graphs capture them (each
call runs on the current stream). Double backward (`create_graph=True`) is not supported: a backward under it
is an error that says to turn the setting off; nor are torch.func transforms (`torch.func.grad`, `vmap`) of a model
running the ops: turn the setting off for them.

cuBLASLt is called through ctypes (models/cublaslt.py) on the copy of the library torch itself loaded.
Each shape's algorithm is cuBLASLt's first heuristic choice, so a rerun (or a resumed run) runs the same kernels.
"""
from __future__ import annotations

import contextlib
import ctypes

import torch
import torch.nn.functional as F

from turbotrain.models import cublaslt as lt
from turbotrain.models.structure import compute_params, on_device, op_switch

_STATE = {"on": False}

_SETTING = "kernels.gelu_epilogue"
_OP_N, _OP_T = lt.OP_N, lt.OP_T
_EPILOGUE, _BIAS_POINTER, _AUX_POINTER, _AUX_LD, _AUX_TYPE = 7, 8, 11, 12, 22  # cublasLt.h's values
_GELU_AUX_BIAS, _DGELU = 32 | 128 | 4, 64 | 128
_DTYPES = {torch.bfloat16: lt.BF16, torch.float16: lt.F16}
# batches of fewer tokens (an empty last batch, one-token evaluation) run the same math in torch: a GEMM of 0 rows
# has nothing to plan, and one row is a vector product, not the shape the epilogue kernels are built for
_MIN_ROWS = 2


_PLANS: dict[tuple, tuple] = {}


def gelu_epilogue(enabled: bool) -> contextlib.AbstractContextManager:
    """`with gelu_epilogue(True): train...` — `gelu_mlp` calls run the epilogue ops where they apply."""
    return op_switch(_STATE, enabled, "gelu_epilogue")


def callers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of `model` that call gelu_mlp (they say so: `calls_gelu_mlp = ("fc", "out")`). Any value
    but None, False or an empty sequence declares a caller; it is never asked for its truth (a tensor has none)."""
    return [m for m in model.modules() if _declares(getattr(m, "calls_gelu_mlp", None))]


def _declares(value) -> bool:
    if value is None or isinstance(value, (bool, int, float)):
        return bool(value)
    return not (isinstance(value, (tuple, list, str)) and len(value) == 0)


def linears_of(module: torch.nn.Module) -> tuple | None:
    """The two modules a caller's `calls_gelu_mlp` names (a tuple or list of two attribute names, dotted paths
    such as "mlp.fc" included), or None where it names no such two (True, one string, three names, a missing
    attribute): such a caller is not assumed to pass linears the epilogues take."""
    names = getattr(module, "calls_gelu_mlp", None)
    if not (isinstance(names, (tuple, list)) and len(names) == 2 and all(isinstance(n, str) for n in names)):
        return None
    try:
        return tuple(module.get_submodule(n) for n in names)
    except Exception:  # no submodule by that name, or a property that raised on the way (a model's `device`)
        return None


def applies_in(model: torch.nn.Module) -> bool:
    """Whether some caller names two linears the epilogues take (else every call runs the plain MLP)."""
    return any((mods := linears_of(m)) is not None and _applies(*mods) for m in callers(model))


def gelu_mlp(x: torch.Tensor, fc: torch.nn.Linear, out: torch.nn.Linear) -> torch.Tensor:
    """`out(F.gelu(fc(x), approximate="tanh"))`, with the GELU in the GEMMs' epilogues where that applies."""
    autocast = torch.is_autocast_enabled("cuda") and x.dtype in (torch.float32, *_DTYPES)  # as autocast casts
    dt = torch.get_autocast_dtype("cuda") if autocast else x.dtype
    if not (_STATE["on"] and x.is_cuda and dt in _DTYPES and _applies(fc, out) and x.shape[-1] == fc.in_features
            and all(t.device == x.device for t in (fc.weight, fc.bias, out.weight, out.bias))):
        return out(F.gelu(fc(x), approximate="tanh"))  # a wrong width or device: torch's own error
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).to(dt)
    g, h = torch.ops.turbotrain.linear_gelu(x2, *compute_params(fc, dt))
    y = torch.ops.turbotrain.gelu_linear(g, h, *compute_params(out, dt))
    return y.view(*shape[:-1], y.shape[-1])


def _applies(fc: torch.nn.Module | None, out: torch.nn.Module | None) -> bool:
    """Plain nn.Linear layers (not an FP8 or other converted linear, whose own GEMM must run) holding plain
    tensors (not sharded DTensors), with biases and sizes cuBLASLt's 16-bit epilogues take (multiples of 8)."""
    linears = (fc, out)
    if any(not (type(m) is torch.nn.Linear or getattr(m, "carries_weight_copies", False)) or m.bias is None
           for m in linears):
        return False
    if any(type(t) not in (torch.Tensor, torch.nn.Parameter) for m in linears for t in (m.weight, m.bias)):
        return False
    return fc.weight.shape[0] == out.weight.shape[1] and all(n > 0 and n % 8 == 0 for n in (*fc.weight.shape,
                                                                                            out.weight.shape[0]))


def library_problem() -> str | None:
    """Why cuBLASLt's epilogues cannot be called here (the rest of a sentence after "needs"), or None."""
    return lt.problem()


def _plan(key: tuple) -> tuple:
    """Descriptors and cuBLASLt's first-choice algorithm (None: none) for D (m x n, column-major) = op(A) op(B)
    + epilogue."""
    if key in _PLANS:
        return _PLANS[key]
    ta, tb, m, n, k, lda, ldb, ldd, dtype, epilogue, align, device = key
    attrs = ((_EPILOGUE, epilogue, ctypes.c_uint32), (_AUX_LD, m, ctypes.c_int64), (_AUX_TYPE, dtype, ctypes.c_int32))
    desc = lt.descriptors(ta, tb, m, n, k, lda, ldb, ldd, dtype, dtype, align, _SETTING, attrs)
    found = lt.candidates(device, *desc, 1, _SETTING)  # none: this shape has no kernel with the epilogue (torch's)
    _PLANS[key] = (*desc[:4], found[0] if found else None)
    return _PLANS[key]


def _matmul(a, ta, b, tb, m, n, k, out, epilogue, bias=None, aux=None) -> bool:
    """out (m x n column-major, i.e. a row-major (n, m) tensor) = op(A) op(B) with `epilogue`; A and B given as
    row-major torch tensors in cuBLASLt's column-major terms (leading dimension = their last size). False where
    cuBLASLt has no kernel for it (nothing written)."""
    align = lt.alignment([t.data_ptr() for t in (a, b, out, bias, aux) if t is not None])  # _aligned: all 16 at least
    key = (ta, tb, m, n, k, a.shape[-1], b.shape[-1], m, _DTYPES[out.dtype], epilogue, align, out.device)
    v = ctypes.c_void_p
    with lt.LOCK:
        desc, la, lb, ld, found = _plan(key)
        if found is None:
            return False
        setd = lt.lib().cublasLtMatmulDescSetAttribute
        if bias is not None:
            lt.set_attr(setd, desc, _BIAS_POINTER, bias.data_ptr(), v, _SETTING)
        lt.set_attr(setd, desc, _AUX_POINTER, aux.data_ptr(), v, _SETTING)
        lt.launch(out.device, desc, la, lb, ld, found, a.data_ptr(), b.data_ptr(), out.data_ptr(), 0.0, _SETTING)
    return True


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned, as cuBLASLt's 16-bit kernels read it (a view at an odd offset is copied)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


@torch.library.custom_op("turbotrain::linear_gelu", mutates_args=())
def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gelu(h), h) for h = x w^T + b: x (N, C), w (H, C), b (H); one GEMM writes both."""
    if x.shape[0] >= _MIN_ROWS:
        x, w, b = (_aligned(t) for t in (x, w, b))
        g = x.new_empty(x.shape[0], w.shape[0])
        h = torch.empty_like(g)
        with on_device(x.device):
            if _matmul(w, _OP_T, x, _OP_N, w.shape[0], x.shape[0], x.shape[1], g, _GELU_AUX_BIAS, bias=b, aux=h):
                return g, h
    h = torch.addmm(b, x, w.t())
    return F.gelu(h, approximate="tanh"), h


@_linear_gelu.register_fake
def _(x, w, b):
    return x.new_empty(x.shape[0], w.shape[0]), x.new_empty(x.shape[0], w.shape[0])


@torch.library.custom_op("turbotrain::gelu_linear", mutates_args=())
def _gelu_linear(g: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """g w^T + b, where g = gelu(h): its gradient goes to h (through GELU's derivative), none to g."""
    return torch.addmm(b, g, w.t())


@_gelu_linear.register_fake
def _(g, h, w, b):
    return g.new_empty(g.shape[0], w.shape[0])


@torch.library.custom_op("turbotrain::gelu_linear_dgrad", mutates_args=())
def _dgrad(dy: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """(dy w) * gelu'(h) in one GEMM: dy (N, C), w (C, H), h (N, H)."""
    if dy.shape[0] >= _MIN_ROWS:
        dy, w, h = (_aligned(t) for t in (dy, w, h))
        dh = torch.empty_like(h)
        with on_device(dy.device):
            if _matmul(w, _OP_N, dy, _OP_N, w.shape[1], dy.shape[0], dy.shape[1], dh, _DGELU, aux=h):
                return dh
    return torch.ops.aten.gelu_backward(dy @ w, h, approximate="tanh")


@_dgrad.register_fake
def _(dy, w, h):
    return torch.empty_like(h)


def _linear_gelu_setup(ctx, inputs, output) -> None:
    x, w, _ = inputs
    g, _ = output
    ctx.mark_non_differentiable(g)  # gelu_linear sends g's gradient through h
    ctx.save_for_backward(x, w)


def _first_order_only() -> None:
    """Under create_graph=True (grad mode on in backward) the gradients would miss terms (g = gelu(h) takes no
    gradient of its own, the dgrad op has no derivative): an error, never a silently wrong second derivative."""
    if torch.is_grad_enabled():
        from turbotrain.errors import UserError

        raise UserError("kernels.gelu_epilogue does not support double backward (create_graph=True, as a "
                        "gradient penalty or MAML needs); set kernels.gelu_epilogue=false")


def _linear_gelu_backward(ctx, dg, dh):
    _first_order_only()
    x, w = ctx.saved_tensors
    need = ctx.needs_input_grad  # frozen weights (fine-tuning) skip their GEMMs, as torch's linear does
    return dh @ w if need[0] else None, dh.t() @ x if need[1] else None, dh.sum(0) if need[2] else None


def _gelu_linear_setup(ctx, inputs, output) -> None:
    g, h, w, _ = inputs
    ctx.save_for_backward(g, h, w)


def _gelu_linear_backward(ctx, dy):
    _first_order_only()
    g, h, w = ctx.saved_tensors
    need = ctx.needs_input_grad
    return (None, torch.ops.turbotrain.gelu_linear_dgrad(dy, w, h) if need[1] else None,
            dy.t() @ g if need[2] else None, dy.sum(0) if need[3] else None)


torch.library.register_autograd("turbotrain::linear_gelu", _linear_gelu_backward, setup_context=_linear_gelu_setup)
torch.library.register_autograd("turbotrain::gelu_linear", _gelu_linear_backward, setup_context=_gelu_linear_setup)
# what selective checkpointing keeps: the GEMMs' outputs, as it keeps plain matmuls'
SAVE_OPS = (torch.ops.turbotrain.linear_gelu.default, torch.ops.turbotrain.gelu_linear.default)

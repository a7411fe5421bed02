"""cuBLASLt matmuls with a fused epilogue, called through ctypes: the GEMM applies bias + GELU and also writes
the GELU input (forward), or multiplies by GELU's derivative and sums the bias gradient (backward).

Why this exists. torch calls cuBLASLt for `addmm` with a bias epilogue, but it exposes the GELU epilogues only
without the auxiliary output a backward needs (`torch._addmm_activation`), and inductor keeps GELU as a separate
Triton kernel that re-reads the whole [tokens × 4·d] activation (forward), and re-reads it with its gradient
(backward). These are the epilogues cuBLASLt documents for exactly this (CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
CUBLASLT_EPILOGUE_DGELU_BGRAD); no Python wheel binds them, so we do, against the copy of libcublasLt torch has
already loaded. Only host-side calls go through ctypes; they are captured into CUDA graphs like torch's own.

Row-major API over cuBLASLt's column-major one: row-major `out = a @ b` is column-major `outᵀ = bᵀ aᵀ`, so b is
cuBLASLt's A operand and a its B. Each 2-D operand is either row-contiguous or a transposed view of a
row-contiguous tensor (an nn.Linear weight's `.t()`); both map to a layout without copying.
"""
from __future__ import annotations

import ctypes
import threading

import torch

EPILOGUE_BIAS = 4
EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4  # out = gelu_tanh(a @ b + bias), aux = a @ b + bias
EPILOGUE_DGELU_BGRAD = 64 | 128 | 16  # out = (a @ b) * gelu_tanh'(aux), bias <- column sums of out

_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_DESC_AUX_POINTER, _DESC_AUX_LD = 11, 12
_PREF_MAX_WORKSPACE_BYTES = 1
_COMPUTE_32F, _R_32F = 68, 0
_DTYPES = {torch.bfloat16: 14, torch.float16: 2}
WORKSPACE_BYTES = 32 << 20


class CublasLtError(RuntimeError):
    """cuBLASLt refused a call: unavailable library, no algorithm for the shape/epilogue, or a failed launch."""


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_lib = None
_lock = threading.Lock()
_handles: dict[int, ctypes.c_void_p] = {}
_workspaces: dict[int, torch.Tensor] = {}
_plans: dict[tuple, "_Plan"] = {}


def _library() -> ctypes.CDLL:
    """The libcublasLt torch loaded (its first matmul loads it), found by its path in this process's maps."""
    global _lib
    if _lib is None:
        torch.ones(8, 8, device="cuda", dtype=torch.bfloat16) @ torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcublasLt.so" in line}
        if not paths:
            raise CublasLtError("libcublasLt is not loaded in this process")
        lib = ctypes.CDLL(sorted(paths)[0])
        vp, i32, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
        sig = {
            "cublasLtCreate": [ctypes.POINTER(vp)],
            "cublasLtMatmulDescCreate": [ctypes.POINTER(vp), i32, i32],
            "cublasLtMatmulDescSetAttribute": [vp, i32, vp, ctypes.c_size_t],
            "cublasLtMatrixLayoutCreate": [ctypes.POINTER(vp), i32, u64, u64, ctypes.c_int64],
            "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(vp)],
            "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, ctypes.c_size_t],
            "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, ctypes.POINTER(_Heuristic),
                                               ctypes.POINTER(i32)],
            "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.c_size_t, vp],
        }
        for name, args in sig.items():
            getattr(lib, name).argtypes = args
            getattr(lib, name).restype = i32
        _lib = lib
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed with cuBLAS status {status}")


def available() -> bool:
    """True when cuBLASLt can be called here (a CUDA device and torch's libcublasLt)."""
    if not torch.cuda.is_available():
        return False
    try:
        with _lock:
            _library()
        return True
    except (OSError, CublasLtError, RuntimeError):
        return False


def _layout(t: torch.Tensor, dtype: int) -> tuple[ctypes.c_void_p, int]:
    """(column-major layout of the matrix t holds in memory, op that turns it into tᵀ) for a 2-D tensor that is
    row-contiguous (layout cols × rows, ld = row stride, op N) or a transposed view (layout rows × cols, op T)."""
    rows, cols = t.shape
    layout = ctypes.c_void_p()
    if t.stride(1) == 1:
        _check(_lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, cols, rows, t.stride(0)), "layout")
        return layout, 0
    _check(_lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, t.stride(1)), "layout")
    return layout, 1


def _set(desc: ctypes.c_void_p, attr: int, value) -> None:
    _check(_lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), ctypes.sizeof(value)), "attribute")


class _Plan:
    """Descriptors and the heuristic's algorithm for one (shapes, strides, dtype, epilogue): built once, reused
    for every call of that signature (only the data pointers change)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, epilogue: int, device: int,
                 bias: torch.Tensor | None, aux: torch.Tensor | None):
        dtype = _DTYPES[out.dtype]
        self.desc = ctypes.c_void_p()
        _check(_lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), _COMPUTE_32F, _R_32F), "descriptor")
        self.b_layout, op_b = _layout(b, dtype)  # cuBLASLt's A
        self.a_layout, op_a = _layout(a, dtype)  # cuBLASLt's B
        self.d_layout = ctypes.c_void_p()
        _check(_lib.cublasLtMatrixLayoutCreate(ctypes.byref(self.d_layout), dtype, out.shape[1], out.shape[0],
                                               out.stride(0)), "layout")
        _set(self.desc, _DESC_TRANSA, ctypes.c_int32(op_b))
        _set(self.desc, _DESC_TRANSB, ctypes.c_int32(op_a))
        _set(self.desc, _DESC_EPILOGUE, ctypes.c_int32(epilogue))
        if epilogue in (EPILOGUE_GELU_AUX_BIAS, EPILOGUE_DGELU_BGRAD):
            _set(self.desc, _DESC_AUX_LD, ctypes.c_int64(out.stride(0)))
        pref = ctypes.c_void_p()
        _check(_lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(_lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8),
               "preference")
        # the heuristic reads the pointers' alignment from the descriptor: give it this call's
        self.set_pointers(bias, aux)
        result, count = _Heuristic(), ctypes.c_int(0)
        status = _lib.cublasLtMatmulAlgoGetHeuristic(_handles[device], self.desc, self.b_layout, self.a_layout,
                                                     self.d_layout, self.d_layout, pref, 1, ctypes.byref(result),
                                                     ctypes.byref(count))
        if status != 0 or count.value < 1:
            raise CublasLtError(f"no cuBLASLt algorithm for {tuple(a.shape)} @ {tuple(b.shape)} with epilogue "
                                f"{epilogue} (status {status})")
        self.algo = result.algo
        self.workspace = result.workspace_size

    def set_pointers(self, bias: torch.Tensor | None, aux: torch.Tensor | None) -> None:
        if bias is not None:
            _set(self.desc, _DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        if aux is not None:
            _set(self.desc, _DESC_AUX_POINTER, ctypes.c_void_p(aux.data_ptr()))


def _signature(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.data_ptr() % 256 == 0


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, epilogue: int,
           bias: torch.Tensor | None = None, aux: torch.Tensor | None = None) -> torch.Tensor:
    """out = a @ b with `epilogue` (EPILOGUE_*), on the current stream. a: [M, K], b: [K, N], out: [M, N]
    row-contiguous, all of one dtype (bf16 or fp16); bias: [N] (input for BIAS/GELU_AUX_BIAS, output for
    DGELU_BGRAD); aux: [M, N] row-contiguous (output for GELU_AUX_BIAS, input for DGELU_BGRAD)."""
    device = out.device.index if out.device.index is not None else torch.cuda.current_device()
    with _lock:
        _library()
        if device not in _handles:
            handle = ctypes.c_void_p()
            _check(_lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
            _handles[device] = handle
            _workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=out.device)
        key = (device, epilogue, out.dtype, _signature(a), _signature(b), _signature(out))
        plan = _plans.get(key)
        if plan is None:
            plan = _plans[key] = _Plan(a, b, out, epilogue, device, bias, aux)
        plan.set_pointers(bias, aux)
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        status = _lib.cublasLtMatmul(
            _handles[device], plan.desc, ctypes.byref(one), ctypes.c_void_p(b.data_ptr()), plan.b_layout,
            ctypes.c_void_p(a.data_ptr()), plan.a_layout, ctypes.byref(zero), ctypes.c_void_p(out.data_ptr()),
            plan.d_layout, ctypes.c_void_p(out.data_ptr()), plan.d_layout, ctypes.byref(plan.algo),
            ctypes.c_void_p(_workspaces[device].data_ptr()), WORKSPACE_BYTES,
            ctypes.c_void_p(torch.cuda.current_stream(out.device).cuda_stream))
    _check(status, "cublasLtMatmul")
    return out

"""cuBLASLt through ctypes on the copy of the library torch itself loaded: no package to install.

Two users: the GELU epilogue GEMMs (models/gelu_epilogue.py, cuBLASLt's heuristic first choice) and `matmul`, a
plain GEMM whose algorithm is chosen by timing cuBLASLt's candidates once per shape (the fused loss's LM-head
GEMMs, accel/fused_loss.py): cuBLAS's first choice is not always its fastest candidate, and for the LM head's
forward and weight-gradient GEMMs another is clearly faster (benchmarks/NOTES.md). Every candidate computes the same
product, each with its own order of summation.

`matmul` times the candidates the first time it meets a shape, and keeps the earliest candidate within MARGIN of the
fastest: the first unless another is clearly faster, so reruns choose alike. A shape first met inside a CUDA-graph
capture, with an accumulating call, or too small to time (MIN_TIMED_FLOP) keeps the first choice.
"""
from __future__ import annotations

import ctypes
import threading

import torch

# cublasLt.h's values (stable across CUDA 11-13)
F32, F16, BF16 = 0, 2, 14
COMPUTE_32F = 68
OP_N, OP_T = 0, 1
TRANSA, TRANSB = 3, 4
PREF_WORKSPACE, PREF_ALIGN = 1, (5, 6, 7, 8)  # the last: A, B, C, D minimum alignment in bytes
WORKSPACE = 32 << 20  # cuBLAS's own default on Hopper
DTYPES = {torch.bfloat16: BF16, torch.float16: F16, torch.float32: F32}
MARGIN = 0.03  # another algorithm replaces the first only when this much faster
CANDIDATES = 8
MIN_TIMED_FLOP = 1e11  # smaller products take the first choice: their timings would be launch overhead
TIMED_MS = 1.0  # GPU time each candidate is run for
LOCK = threading.Lock()  # descriptors are shared by calls of one shape; their pointers are set per call

_LT: dict = {}  # "lib", and a cuBLASLt handle per device index
_PLANS: dict[tuple, tuple] = {}


class Heuristic(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def lib():
    if "lib" not in _LT:
        torch.cuda.init()
        with open("/proc/self/maps") as f:  # the copy torch loaded, whichever CUDA it came with
            path = next((line.split()[-1] for line in f if "libcublasLt.so" in line), None)
        if path is None:
            raise OSError("no libcublasLt among the libraries this process loaded")
        cdll, v = ctypes.CDLL(path), ctypes.c_void_p
        cdll.cublasLtMatmul.argtypes = [v] * 14 + [ctypes.c_size_t, v]
        cdll.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(v), ctypes.c_int, ctypes.c_uint64,
                                                    ctypes.c_uint64, ctypes.c_int64]
        cdll.cublasLtMatmulDescSetAttribute.argtypes = [v, ctypes.c_int, v, ctypes.c_size_t]
        cdll.cublasLtMatmulPreferenceSetAttribute.argtypes = [v, ctypes.c_int, v, ctypes.c_size_t]
        cdll.cublasLtMatmulAlgoGetHeuristic.argtypes = [v] * 7 + [ctypes.c_int, ctypes.POINTER(Heuristic),
                                                                  ctypes.POINTER(ctypes.c_int)]
        _LT["lib"] = cdll
    return _LT["lib"]


def problem() -> str | None:
    """Why cuBLASLt cannot be called here (the rest of a sentence after "needs"), or None."""
    try:
        lib()
    except Exception as e:  # no CUDA in this torch, the library not loaded, a symbol missing, a status
        return f"cuBLASLt, which this torch did not load or does not answer ({type(e).__name__}: {e})"
    return None


def handle(device: torch.device, setting: str):
    """The device's cuBLASLt handle (created while it is current)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _LT:
        h = ctypes.c_void_p()
        with torch.cuda.device(index):
            check(lib().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate", setting)
        _LT[index] = h
    return _LT[index]


def check(status: int, what: str, setting: str) -> None:
    if status != 0:
        raise RuntimeError(f"{setting}: {what} failed (cuBLAS status {status}); set {setting}=false")


def set_attr(setter, obj, attr: int, value, ctype, setting: str) -> None:
    c = ctype(value)
    check(setter(obj, attr, ctypes.byref(c), ctypes.sizeof(c)), f"setting attribute {attr}", setting)


def alignment(ptrs: list[int]) -> int:
    """The largest power-of-two alignment (16..256 bytes) of every pointer: larger ones let cuBLASLt pick more
    kernels."""
    align = 256
    while align > 16 and any(p % align for p in ptrs):
        align //= 2
    return align


def descriptors(ta: int, tb: int, m: int, n: int, k: int, lda: int, ldb: int, ldd: int, ab_type: int, d_type: int,
                align: int, setting: str, attrs: tuple = ()) -> tuple:
    """(desc, A, B, D layouts, preference) for D (m x n, column-major) = op(A) op(B); `attrs`: more
    (attribute, value, ctype) of the operation descriptor (an epilogue)."""
    cl, v = lib(), ctypes.c_void_p
    desc, a, b, d, pref = v(), v(), v(), v(), v()
    check(cl.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, F32), "cublasLtMatmulDescCreate", setting)
    for attr, value, ctype in ((TRANSA, ta, ctypes.c_int32), (TRANSB, tb, ctypes.c_int32), *attrs):
        set_attr(cl.cublasLtMatmulDescSetAttribute, desc, attr, value, ctype, setting)
    for lay, rows, cols, ld, typ in ((a, *((m, k) if ta == OP_N else (k, m)), lda, ab_type),
                                     (b, *((k, n) if tb == OP_N else (n, k)), ldb, ab_type), (d, m, n, ldd, d_type)):
        check(cl.cublasLtMatrixLayoutCreate(ctypes.byref(lay), typ, rows, cols, ld), "a matrix layout", setting)
    check(cl.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate", setting)
    set_attr(cl.cublasLtMatmulPreferenceSetAttribute, pref, PREF_WORKSPACE, WORKSPACE, ctypes.c_uint64, setting)
    for attr in PREF_ALIGN:
        set_attr(cl.cublasLtMatmulPreferenceSetAttribute, pref, attr, align, ctypes.c_uint32, setting)
    return desc, a, b, d, pref


def candidates(device: torch.device, desc, a, b, d, pref, count: int, setting: str) -> list[Heuristic]:
    """cuBLASLt's heuristic candidates, best guess first ([] where none exists for this shape)."""
    found, n = (Heuristic * count)(), ctypes.c_int(0)
    status = lib().cublasLtMatmulAlgoGetHeuristic(handle(device, setting), desc, a, b, d, d, pref, count, found,
                                                  ctypes.byref(n))
    return [] if status != 0 else [found[i] for i in range(n.value)]


def launch(device, desc, la, lb, ld, algo: Heuristic, a: int, b: int, out: int, beta: float, setting: str,
           work: torch.Tensor | None = None) -> None:
    """out = op(A) op(B) + beta * out, on the current stream, with `algo`'s workspace (`work`, else allocated)."""
    v = ctypes.c_void_p
    if work is None:
        work = torch.empty(max(algo.workspace, 1), dtype=torch.uint8, device=device)
    one, b_ = ctypes.c_float(1.0), ctypes.c_float(beta)
    check(lib().cublasLtMatmul(handle(device, setting), desc, ctypes.byref(one), v(a), la, v(b), lb, ctypes.byref(b_),
                               v(out), ld, v(out), ld, ctypes.byref(algo.algo), v(work.data_ptr()), algo.workspace,
                               v(torch.cuda.current_stream(device).cuda_stream)), "cublasLtMatmul", setting)


def takes(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_t: bool, b_t: bool) -> bool:
    """Whether `matmul` runs this product (else the caller runs torch's): CUDA tensors of one device, contiguous 2-D
    bf16/fp16 inputs of one dtype, out theirs or fp32, agreeing shapes, every size a nonzero multiple of 8, 16-byte
    aligned, and torch allowing reduced-precision reductions in that dtype (as torch's own GEMMs then may)."""
    if not (a.is_cuda and b.device == a.device == out.device and a.dtype == b.dtype
            and a.dtype in (torch.bfloat16, torch.float16) and out.dtype in (a.dtype, torch.float32)
            and all(t.dim() == 2 and t.is_contiguous() for t in (a, b, out))):
        return False
    (m, k), (k2, n) = (a.shape[::-1] if a_t else a.shape), (b.shape[::-1] if b_t else b.shape)
    reduced = torch.backends.cuda.matmul
    allowed = (reduced.allow_bf16_reduced_precision_reduction if a.dtype == torch.bfloat16
               else reduced.allow_fp16_reduced_precision_reduction)
    return (k == k2 and tuple(out.shape) == (m, n) and all(x > 0 and x % 8 == 0 for x in (m, n, k))
            and all(t.data_ptr() % 16 == 0 for t in (a, b, out)) and bool(allowed))


def matmul(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_t: bool, b_t: bool, accumulate: bool,
           setting: str) -> bool:
    """out (row-major M x N) = op(a) @ op(b) (+ out where `accumulate`), op = transpose where a_t / b_t, with the
    fastest of cuBLASLt's candidates for this shape (see the module's docstring). False where it does not run
    (`takes`, or no candidate): nothing written, the caller runs torch's."""
    if not takes(out, a, b, a_t, b_t):
        return False
    # row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T
    m, n, k = out.shape[1], out.shape[0], a.shape[0] if a_t else a.shape[1]
    key = (OP_T if b_t else OP_N, OP_T if a_t else OP_N, m, n, k, b.shape[-1], a.shape[-1], DTYPES[a.dtype],
           DTYPES[out.dtype], alignment([t.data_ptr() for t in (a, b, out)]), out.device)
    with LOCK, torch.cuda.device(out.device):
        plan = _PLANS.get(key)
        if plan is None:
            desc = descriptors(*key[:5], key[5], key[6], m, key[7], key[8], key[9], setting)
            plan = _PLANS[key] = (*desc[:4], candidates(out.device, *desc, CANDIDATES, setting))
        desc, la, lb, ld, algos = plan
        if len(algos) > 1:  # the plan keeps the choice for this shape
            # timed only outside a capture, on a product big enough to time, into out where the call overwrites it
            # anyway (an accumulator is not); else the first choice
            timed = not (accumulate or torch.cuda.is_current_stream_capturing() or 2 * m * n * k < MIN_TIMED_FLOP)
            algos[:] = _fastest(out, desc, la, lb, ld, algos, b, a, setting) if timed else algos[:1]
        if not algos:  # no candidate, or none that ran
            return False
        launch(out.device, desc, la, lb, ld, algos[0], b.data_ptr(), a.data_ptr(), out.data_ptr(),
               1.0 if accumulate else 0.0, setting)
    return True


def _fastest(out, desc, la, lb, ld, algos, a_cb, b_cb, setting) -> list[Heuristic]:
    """[the candidate to keep] by CUDA-event timing (`pick`), each run until ~TIMED_MS of GPU time with one workspace
    for all; [] where none ran. Runs each on the call's own inputs, writing `out`."""
    work = torch.empty(max([1, *(h.workspace for h in algos)]), dtype=torch.uint8, device=out.device)
    times = []
    for algo in algos:
        def run(algo=algo):
            launch(out.device, desc, la, lb, ld, algo, a_cb.data_ptr(), b_cb.data_ptr(), out.data_ptr(), 0.0, setting,
                   work)
        try:
            run()
            once = _elapsed(run, 1)
            times.append(_elapsed(run, max(2, min(50, round(TIMED_MS / max(once, 1e-3))))))
        except RuntimeError:  # a candidate the library offers but cannot run here
            times.append(float("inf"))
    return [] if min(times) == float("inf") else [algos[pick(times)]]


def _elapsed(run, reps: int) -> float:
    """Milliseconds a run of `run` takes, by CUDA events over `reps` runs."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def pick(times: list[float]) -> int:
    """The first (lowest) index whose time is within MARGIN of the fastest: the heuristic's first choice unless
    another is at least MARGIN faster, and among near-ties always the earliest, so reruns choose alike."""
    best = min(times)
    return next(i for i, t in enumerate(times) if t <= best * (1 + MARGIN))

"""Experiment: cuBLASLt's candidate algorithms for the LM head's three GEMMs inside the fused loss (GPT-2: 16,384
tokens, vocab 50,304, width 768, bf16; the weight gradient written in fp32), against torch's own call."""
import ctypes
import sys

import torch

sys.path.insert(0, "src")
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from turbotrain.models import gelu_epilogue as ge  # noqa: E402


def ev_time(fn, reps=20, rounds=5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / reps)
    return sorted(ts)[len(ts) // 2]


def kernels(fn):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return [e.name[:80] for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]

T, V, D = 16384, 50304, 768
dt = torch.bfloat16
lib, v = ge._lib(), ctypes.c_void_p


def plan(ta, tb, m, n, k, lda, ldb, ldd, dtype_d):
    desc, a, b, d, pref = v(), v(), v(), v(), v()
    ge._check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), ge._COMPUTE_32F, ge._F32), "desc")
    for attr, value in ((ge._TRANSA, ta), (ge._TRANSB, tb)):
        ge._set(lib.cublasLtMatmulDescSetAttribute, desc, attr, value, ctypes.c_int32)
    for lay, rows, cols, ld, typ in ((a, *((m, k) if ta == ge._OP_N else (k, m)), lda, ge._BF16),
                                     (b, *((k, n) if tb == ge._OP_N else (n, k)), ldb, ge._BF16),
                                     (d, m, n, ldd, dtype_d)):
        ge._check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), typ, rows, cols, ld), "layout")
    ge._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
    ge._set(lib.cublasLtMatmulPreferenceSetAttribute, pref, ge._PREF_WORKSPACE, ge.WORKSPACE, ctypes.c_uint64)
    found, cnt = (ge._Heuristic * 10)(), ctypes.c_int(0)
    ge._check(lib.cublasLtMatmulAlgoGetHeuristic(ge._handle(torch.device("cuda")), desc, a, b, d, d, pref, 10, found,
                                                 ctypes.byref(cnt)), "heuristic")
    return desc, a, b, d, [found[i] for i in range(cnt.value)]


def run_all(name, A, ta, B, tb, m, n, k, out, dtype_d, ref_fn):
    print(f"torch {name}: {ev_time(ref_fn):.4f} ms, kernels {kernels(ref_fn)}", flush=True)
    desc, la, lb, ld, algos = plan(ta, tb, m, n, k, A.shape[-1], B.shape[-1], m, dtype_d)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    for i, h in enumerate(algos):
        work = torch.empty(max(h.workspace, 1), dtype=torch.uint8, device="cuda")

        def run():
            ge._check(lib.cublasLtMatmul(ge._handle(out.device), desc, ctypes.byref(one), v(A.data_ptr()), la,
                                         v(B.data_ptr()), lb, ctypes.byref(zero), v(out.data_ptr()), ld,
                                         v(out.data_ptr()), ld, ctypes.byref(h.algo), v(work.data_ptr()), h.workspace,
                                         v(torch.cuda.current_stream().cuda_stream)), "matmul")
        try:
            ms = ev_time(run, reps=10)
        except Exception as e:  # noqa: BLE001
            print(f"{name} algo {i}: failed {e}", flush=True)
            continue
        print(f"{name} algo {i}: {ms:.4f} ms, ws {h.workspace >> 10} KiB, kernels {kernels(run)}", flush=True)


torch.manual_seed(0)
hc = torch.randn(T, D, device="cuda", dtype=dt)
w = torch.randn(V, D, device="cuda", dtype=dt) * 0.02
dl = torch.randn(T, V, device="cuda", dtype=dt) * 1e-3
logits = torch.empty(T, V, device="cuda", dtype=dt)
gh = torch.empty(T, D, device="cuda", dtype=dt)
gw = torch.empty(V, D, device="cuda", dtype=torch.float32)
run_all("head fwd", w, ge._OP_T, hc, ge._OP_N, V, T, D, logits, ge._BF16, lambda: hc @ w.t())
run_all("head dgrad", w, ge._OP_N, dl, ge._OP_N, D, T, V, gh, ge._BF16, lambda: torch.mm(dl, w, out=gh))
run_all("head wgrad fp32", hc, ge._OP_N, dl, ge._OP_T, D, V, T, gw, ge._F32,
        lambda: torch.addmm(gw, dl.t(), hc, beta=0, out_dtype=torch.float32, out=gw))

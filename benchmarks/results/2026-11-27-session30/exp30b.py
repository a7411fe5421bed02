"""Experiment: cuBLASLt's candidate algorithms for GPT-2's two epilogue GEMMs (models/gelu_epilogue.py: GELU_AUX_BIAS
making gelu(h) and h, DGELU making dh), 16,384 tokens, 768 -> 3,072, bf16, each timed alone with CUDA events. The op
takes the heuristic's first; how far is the fastest?"""
import ctypes
import sys

import torch

sys.path.insert(0, "src")
from turbotrain.models import gelu_epilogue as ge  # noqa: E402

N, C, H = 16384, 768, 3072
dt = torch.bfloat16
torch.manual_seed(0)
x, w1, b1 = (torch.randn(N, C, device="cuda", dtype=dt), torch.randn(H, C, device="cuda", dtype=dt) * 0.02,
             torch.randn(H, device="cuda", dtype=dt))
dy, w2 = torch.randn(N, C, device="cuda", dtype=dt), torch.randn(C, H, device="cuda", dtype=dt) * 0.02
g, h, dh = (torch.empty(N, H, device="cuda", dtype=dt) for _ in range(3))
cases = {  # (a, ta, b, tb, m, n, k, out, epilogue, bias, aux), as the ops call _matmul
    "gelu_aux_bias": (w1, ge._OP_T, x, ge._OP_N, H, N, C, g, ge._GELU_AUX_BIAS, b1, h),
    "dgelu": (w2, ge._OP_N, dy, ge._OP_N, H, N, C, dh, ge._DGELU, None, h),
}
lib, v = ge._lib(), ctypes.c_void_p
for name, (a, ta, b, tb, m, n, k, out, epi, bias, aux) in cases.items():
    key = (ta, tb, m, n, k, a.shape[-1], b.shape[-1], m, ge._DTYPES[dt], epi, 256, out.device)
    desc, la, lb, ld, first = ge._plan(key)
    pref = v()
    ge._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
    ge._set(lib.cublasLtMatmulPreferenceSetAttribute, pref, ge._PREF_WORKSPACE, ge.WORKSPACE, ctypes.c_uint64)
    for attr in ge._PREF_ALIGN:
        ge._set(lib.cublasLtMatmulPreferenceSetAttribute, pref, attr, 256, ctypes.c_uint32)
    found, count = (ge._Heuristic * 16)(), ctypes.c_int(0)
    ge._check(lib.cublasLtMatmulAlgoGetHeuristic(ge._handle(out.device), desc, la, lb, ld, ld, pref, 16, found,
                                                 ctypes.byref(count)), "heuristic")
    if bias is not None:
        ge._set(lib.cublasLtMatmulDescSetAttribute, desc, ge._BIAS_POINTER, bias.data_ptr(), v)
    ge._set(lib.cublasLtMatmulDescSetAttribute, desc, ge._AUX_POINTER, aux.data_ptr(), v)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    ref = None
    for i in range(count.value):
        heur = found[i]
        work = torch.empty(max(heur.workspace, 1), dtype=torch.uint8, device="cuda")

        def run():
            ge._check(lib.cublasLtMatmul(ge._handle(out.device), desc, ctypes.byref(one), v(a.data_ptr()), la,
                                         v(b.data_ptr()), lb, ctypes.byref(zero), v(out.data_ptr()), ld,
                                         v(out.data_ptr()), ld, ctypes.byref(heur.algo), v(work.data_ptr()),
                                         heur.workspace, v(torch.cuda.current_stream().cuda_stream)), "matmul")
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(20):
                run()
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) / 20)
        res = out.float().clone()
        ref = res if ref is None else ref
        print(f"{name} algo {i}: median {sorted(times)[2]:.4f} ms (min {min(times):.4f}), workspace {heur.workspace}, "
              f"waves {heur.waves:.2f}, max diff to algo 0 {(res - ref).abs().max().item():.3g}", flush=True)

"""Experiment: which cuBLASLt kernels serve GPT-2's MLP epilogue GEMMs in each operand layout, and the weight-gradient
GEMMs (split-K today). 16,384 tokens, bf16, CUDA events; each candidate's kernels named by the profiler."""
import ctypes
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "src")
from turbotrain.models import gelu_epilogue as ge  # noqa: E402

N, C, H = 16384, 768, 3072
dt = torch.bfloat16
dev = "cuda"
torch.manual_seed(0)
lib, v = ge._lib(), ctypes.c_void_p
DEFAULT, BIAS = 1, 4


def ev_time(fn, reps=20, rounds=5):
    for _ in range(5):
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
    return [e.name[:90] for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def candidates(name, a, ta, b, tb, m, n, k, out, epi, bias=None, aux=None, count=16):
    key = (ta, tb, m, n, k, a.shape[-1], b.shape[-1], m, ge._DTYPES[dt], epi, 256, out.device)
    desc, la, lb, ld, first = ge._plan(key)
    pref = v()
    ge._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
    ge._set(lib.cublasLtMatmulPreferenceSetAttribute, pref, ge._PREF_WORKSPACE, ge.WORKSPACE, ctypes.c_uint64)
    for attr in ge._PREF_ALIGN:
        ge._set(lib.cublasLtMatmulPreferenceSetAttribute, pref, attr, 256, ctypes.c_uint32)
    found, cnt = (ge._Heuristic * count)(), ctypes.c_int(0)
    st = lib.cublasLtMatmulAlgoGetHeuristic(ge._handle(out.device), desc, la, lb, ld, ld, pref, count, found,
                                            ctypes.byref(cnt))
    if st != 0 or cnt.value == 0:
        print(f"{name}: no algorithm (status {st})", flush=True)
        return
    if bias is not None:
        ge._set(lib.cublasLtMatmulDescSetAttribute, desc, ge._BIAS_POINTER, bias.data_ptr(), v)
    if aux is not None:
        ge._set(lib.cublasLtMatmulDescSetAttribute, desc, ge._AUX_POINTER, aux.data_ptr(), v)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    ref = None
    for i in range(cnt.value):
        heur = found[i]
        work = torch.empty(max(heur.workspace, 1), dtype=torch.uint8, device=dev)

        def run():
            ge._check(lib.cublasLtMatmul(ge._handle(out.device), desc, ctypes.byref(one), v(a.data_ptr()), la,
                                         v(b.data_ptr()), lb, ctypes.byref(zero), v(out.data_ptr()), ld,
                                         v(out.data_ptr()), ld, ctypes.byref(heur.algo), v(work.data_ptr()),
                                         heur.workspace, v(torch.cuda.current_stream().cuda_stream)), "matmul")
        try:
            ms = ev_time(run)
        except Exception as e:  # noqa: BLE001
            print(f"{name} algo {i}: failed {e}", flush=True)
            continue
        res = out.float().clone()
        ref = res if ref is None else ref
        print(f"{name} algo {i}: {ms:.4f} ms, ws {heur.workspace >> 10} KiB, waves {heur.waves:.2f}, "
              f"diff {(res - ref).abs().max().item():.3g}, kernels {kernels(run)}", flush=True)


x, w1, b1 = (torch.randn(N, C, device=dev, dtype=dt), torch.randn(H, C, device=dev, dtype=dt) * 0.02,
             torch.randn(H, device=dev, dtype=dt))
dy, w2 = torch.randn(N, C, device=dev, dtype=dt), torch.randn(C, H, device=dev, dtype=dt) * 0.02
g, h, dh = (torch.empty(N, H, device=dev, dtype=dt) for _ in range(3))
w1t, w2t, dyt = w1.t().contiguous(), w2.t().contiguous(), dy.t().contiguous()

print("== references (torch)", flush=True)
hh = torch.addmm(b1, x, w1.t())
print(f"addmm fc fwd {ev_time(lambda: torch.addmm(b1, x, w1.t())):.4f} ms, kernels {kernels(lambda: torch.addmm(b1, x, w1.t()))}")
print(f"gelu fwd {ev_time(lambda: torch.nn.functional.gelu(hh, approximate='tanh')):.4f} ms")
print(f"mm dgrad dy@w2 {ev_time(lambda: dy @ w2):.4f} ms, kernels {kernels(lambda: dy @ w2)}")
dd = dy @ w2
print(f"gelu bwd {ev_time(lambda: torch.ops.aten.gelu_backward(dd, hh, approximate='tanh')):.4f} ms")
print(f"transpose w2 copy {ev_time(lambda: w2.t().contiguous()):.4f} ms", flush=True)

print("== DGELU layouts", flush=True)
candidates("dgelu NN", w2, ge._OP_N, dy, ge._OP_N, H, N, C, dh, ge._DGELU, aux=h)
candidates("dgelu TN", w2t, ge._OP_T, dy, ge._OP_N, H, N, C, dh, ge._DGELU, aux=h)
candidates("dgelu NT", w2, ge._OP_N, dyt, ge._OP_T, H, N, C, dh, ge._DGELU, aux=h)
candidates("dgelu TT", w2t, ge._OP_T, dyt, ge._OP_T, H, N, C, dh, ge._DGELU, aux=h)
print("== GELU_AUX_BIAS layouts", flush=True)
candidates("geluaux TN", w1, ge._OP_T, x, ge._OP_N, H, N, C, g, ge._GELU_AUX_BIAS, bias=b1, aux=h, count=6)
candidates("geluaux NN", w1t, ge._OP_N, x, ge._OP_N, H, N, C, g, ge._GELU_AUX_BIAS, bias=b1, aux=h, count=6)
print("== weight gradients (plain)", flush=True)
for nm, I, O in (("qkv", C, 3 * C), ("proj", C, C), ("fc", C, H), ("mproj", H, C)):
    X = torch.randn(N, I, device=dev, dtype=dt)
    DY = torch.randn(N, O, device=dev, dtype=dt)
    W = torch.empty(O, I, device=dev, dtype=dt)
    print(f"torch wgrad {nm} {ev_time(lambda: DY.t() @ X):.4f} ms, kernels {kernels(lambda: DY.t() @ X)}", flush=True)
    candidates(f"wgrad {nm}", X, ge._OP_N, DY, ge._OP_T, I, O, N, W, DEFAULT, count=8)

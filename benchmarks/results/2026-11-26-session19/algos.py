"""Every cuBLASLt algorithm the heuristic offers for GPT-2's MLP GEMMs with each epilogue, timed; kernels named."""
import ctypes, torch, torch.nn.functional as F
from turbotrain.accel import cublaslt as lt
from torch.profiler import profile, ProfilerActivity

dev, bf = "cuda", torch.bfloat16
M, C, H = 16 * 1024, 768, 3072
torch.manual_seed(0)
x = torch.randn(M, C, device=dev, dtype=bf); w1 = torch.randn(H, C, device=dev, dtype=bf) * .02
b1 = torch.randn(H, device=dev, dtype=bf) * .02; w2 = torch.randn(C, H, device=dev, dtype=bf) * .02
dy = torch.randn(M, C, device=dev, dtype=bf) * .01
pre = torch.randn(M, H, device=dev, dtype=bf); out = torch.empty(M, H, device=dev, dtype=bf)
aux = torch.empty(M, H, device=dev, dtype=bf); db1 = torch.empty(H, device=dev, dtype=bf)

def t(fn, n=30):
    for _ in range(3): fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n

def kernels(fn):
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn(); torch.cuda.synchronize()
    return [(e.name[:90], round(e.device_time_total / 1000, 3)) for e in p.events() if e.device_type.name == "CUDA"]

print("torch: x@w1.t()+b1", round(t(lambda: torch.addmm(b1, x, w1.t())), 4), "ms")
print("torch: gelu(pre)", round(t(lambda: F.gelu(pre, approximate="tanh")), 4))
print("torch: dy@w2", round(t(lambda: dy @ w2), 4))
print("torch: gelu_backward", round(t(lambda: torch.ops.aten.gelu_backward(out, pre, approximate="tanh")), 4))
cases = [("GELU_AUX_BIAS fwd", x, w1.t(), out, lt.EPILOGUE_GELU_AUX_BIAS, b1, aux),
         ("DGELU_BGRAD bwd", dy, w2, out, lt.EPILOGUE_DGELU_BGRAD, db1, pre),
         ("DGELU bwd", dy, w2, out, 64 | 128, None, pre),
         ("BIAS fwd", x, w1.t(), out, lt.EPILOGUE_BIAS, b1, None),
         ("DEFAULT bwd", dy, w2, out, 1, None, None)]
for name, a, b, o, epi, bias, ax in cases:
    try:
        lt.matmul(a, b, o, epi, bias=bias, aux=ax)
        plan = [p for k, p in lt._plans.items() if k[1] == epi][-1]
        pref = ctypes.c_void_p(); lt._lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref))
        ws = ctypes.c_uint64(lt.WORKSPACE_BYTES); lt._lib.cublasLtMatmulPreferenceSetAttribute(pref, 1, ctypes.byref(ws), 8)
        res = (lt._Heuristic * 32)(); cnt = ctypes.c_int(0)
        st = lt._lib.cublasLtMatmulAlgoGetHeuristic(lt._handles[0], plan.desc, plan.b_layout, plan.a_layout, plan.d_layout,
                                                    plan.d_layout, pref, 32, res, ctypes.byref(cnt))
        print(f"== {name}: {cnt.value} algorithms (status {st})", flush=True)
        best = None
        for i in range(cnt.value):
            plan.algo = res[i].algo
            try:
                ms = t(lambda: lt.matmul(a, b, o, epi, bias=bias, aux=ax))
            except Exception as e:
                print(f"  algo {i}: failed {e}"); continue
            print(f"  algo {i}: {ms:.4f} ms  ws {res[i].workspace_size}", flush=True)
            if best is None or ms < best[0]: best = (ms, i)
        plan.algo = res[best[1]].algo
        print("  best", best, kernels(lambda: lt.matmul(a, b, o, epi, bias=bias, aux=ax)), flush=True)
    except Exception as e:
        import traceback; traceback.print_exc()

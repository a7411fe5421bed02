"""GPU check of the cuBLASLt GELU epilogues: numerics vs fp32 references, and time vs compiled layers."""
import sys, time, json
import torch, torch.nn.functional as F
from turbotrain.accel import cublaslt
from turbotrain.accel.gelu_mlp import gelu_mlp, _lt_available

print("lt available", cublaslt.available(), flush=True)
torch.manual_seed(0)
dev = "cuda"
M, C, H = 16 * 1024, 768, 3072
bf = torch.bfloat16
x = torch.randn(M, C, device=dev)
w1 = torch.randn(H, C, device=dev) * 0.02; b1 = torch.randn(H, device=dev) * 0.02
w2 = torch.randn(C, H, device=dev) * 0.02; b2 = torch.randn(C, device=dev) * 0.02
dy = torch.randn(M, C, device=dev) * 0.01
P = [t.to(bf).requires_grad_() for t in (x, w1, b1, w2, b2)]

def ref(approx, dt=torch.float64):
    ts = [t.detach().to(dt).requires_grad_() for t in P]
    y = F.linear(F.gelu(F.linear(ts[0], ts[1], ts[2]), approximate=approx), ts[3], ts[4])
    y.backward(dy.to(dt))
    return [y.detach()] + [t.grad for t in ts]

def fused():
    ts = [t.detach().requires_grad_() for t in P]
    y = torch.ops.turbotrain.gelu_mlp(*ts)[0]
    y.backward(dy.to(bf))
    return [y.detach()] + [t.grad for t in ts]

def unfused_bf16():
    ts = [t.detach().requires_grad_() for t in P]
    y = F.linear(F.gelu(F.linear(ts[0], ts[1], ts[2]), approximate="tanh"), ts[3], ts[4])
    y.backward(dy.to(bf))
    return [y.detach()] + [t.grad for t in ts]

names = ["y", "dx", "dw1", "db1", "dw2", "db2"]
try:
    r_tanh, r_erf = ref("tanh"), ref("none")
    for label, got in (("fused", fused()), ("unfused-bf16", unfused_bf16())):
        for n, g, a, b in zip(names, got, r_tanh, r_erf):
            g = g.double()
            e_t = ((g - a).norm() / a.norm()).item(); e_e = ((g - b).norm() / b.norm()).item()
            print(f"{label:13s} {n:4s} rel err vs tanh {e_t:.3e}  vs erf {e_e:.3e}", flush=True)
except Exception as e:
    import traceback; traceback.print_exc()

def mlp_layers(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)

def mlp_op(x, w1, b1, w2, b2):
    return torch.ops.turbotrain.gelu_mlp(x, w1, b1, w2, b2)[0]

def bench(fn, label, iters=50):
    ts = [t.detach().requires_grad_() for t in P]
    g = dy.to(bf)
    for _ in range(5):
        fn(*ts).backward(g)
    torch.cuda.synchronize()
    times = []
    for rep in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn(*ts).backward(g)
        e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / iters)
    times.sort()
    print(f"{label:40s} fwd+bwd {times[2]:.3f} ms (min {times[0]:.3f} max {times[-1]:.3f})", flush=True)
    return times[2]

res = {}
for label, fn in (("layers compiled default", torch.compile(mlp_layers)),
                  
                  ("op eager", mlp_op),
                  ("op compiled fullgraph", torch.compile(mlp_op, fullgraph=True)),
                  ("layers eager", mlp_layers)):
    try:
        res[label] = bench(fn, label)
    except Exception:
        import traceback; traceback.print_exc()

# kernel breakdown of the two
from torch.profiler import profile, ProfilerActivity
for label, fn in (("layers compiled default", torch.compile(mlp_layers)), ("op eager", mlp_op)):
    ts = [t.detach().requires_grad_() for t in P]; g = dy.to(bf)
    for _ in range(3): fn(*ts).backward(g)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10): fn(*ts).backward(g)
        torch.cuda.synchronize()
    print(f"--- kernels: {label} (per iteration)")
    ev = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            ev.setdefault(e.name, [0, 0]); ev[e.name][0] += e.device_time_total if hasattr(e, 'device_time_total') else e.cuda_time_total; ev[e.name][1] += 1
    for n, (t, c) in sorted(ev.items(), key=lambda kv: -kv[1][0])[:14]:
        print(f"  {t/10/1000:.3f} ms  x{c/10:.0f}  {n[:110]}")
print(json.dumps(res))

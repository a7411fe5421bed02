"""A callback that traces steps 41..55 of a training run (CPU + CUDA) and reports where the GPU idles."""
import json, os, sys
import torch
from torch.profiler import profile, ProfilerActivity
from turbotrain.callbacks import Callback

START, STOP = 41, 56  # on_step_end(step 40) starts: steps 41..55 traced (a log step, 50, inside)


class Trace(Callback):
    def __init__(self):
        self.prof = None

    def on_step_end(self, state):
        if state.step == START - 1:
            torch.cuda.synchronize()
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()
        elif state.step == STOP - 1 and self.prof is not None:
            torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)
            out = os.environ.get("TRACE_OUT", "/tmp/trace.json")
            self.prof.export_chrome_trace(out)
            report(out, STOP - START)
            self.prof = None


def report(path, steps):
    ev = json.load(open(path))["traceEvents"]
    if not any(e.get("cat") == "kernel" for e in ev):
        print("TRACE: no kernels"); return
    kern = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    cpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime", "python_function", "user_annotation")]
    busy, gaps, end = 0.0, [], kern[0][0]
    for s, e, n in kern:
        if s > end:
            gaps.append((s - end, end, s, n))
        busy += max(0.0, e - max(s, end)); end = max(end, e)
    span = end - kern[0][0]
    print(f"TRACE {steps} steps: span {span/1e3:.2f} ms = {span/steps/1e3:.3f} ms/step; GPU busy {busy/1e3:.2f} ms "
          f"({busy/span:.1%}); idle {(span-busy)/1e3:.2f} ms = {(span-busy)/steps/1e3:.3f} ms/step; gaps>20us: "
          f"{sum(1 for g in gaps if g[0] > 20)}", flush=True)
    gaps.sort(reverse=True)
    for d, a, b, nxt in gaps[:12]:
        during = sorted({c["name"][:60] for c in cpu if c["ts"] < b and c["ts"] + c["dur"] > a and c["dur"] < 5e5},
                        key=len)[:8]
        print(f"  gap {d/1e3:.3f} ms before {nxt[:50]}; host then: {during}", flush=True)
    hist = {}
    for d, *_ in gaps:
        k = "<5us" if d < 5 else "5-20us" if d < 20 else "20-100us" if d < 100 else "100us-1ms" if d < 1000 else ">1ms"
        hist[k] = hist.get(k, 0) + d
    print("  idle by gap size (ms):", {k: round(v / 1e3, 3) for k, v in hist.items()}, flush=True)

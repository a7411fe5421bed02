"""Kernel totals per step from a chrome trace (json): argv trace.json steps"""
import collections, json, sys
tr = json.load(open(sys.argv[1])); steps = int(sys.argv[2])
k = collections.defaultdict(lambda: [0.0, 0])
for e in tr["traceEvents"]:
    if e.get("cat") == "kernel":
        k[e["name"]][0] += e["dur"] / 1e3 / steps; k[e["name"]][1] += 1
def cls(n):
    if n.startswith(("nvjet", "sm90_xmma", "cutlass", "ampere", "sm80")) or "gemm" in n.lower(): return "gemm"
    if "cudnn" in n or "fmha" in n or "flash" in n: return "attention"
    if "multi_tensor_apply" in n or "FusedOptimizer" in n: return "optimizer"
    if n.startswith("triton"): return "triton"
    return "other"
c = collections.defaultdict(float)
for n, (ms, _) in k.items(): c[cls(n)] += ms
tot = sum(c.values())
print(f"kernel time per step {tot:.3f} ms, launches/step {sum(v[1] for v in k.values())/steps:.0f}")
for n, ms in sorted(c.items(), key=lambda x: -x[1]): print(f"  {n:12s} {ms:7.3f} ms  {ms/tot:6.1%}")
for n, (ms, cnt) in sorted(k.items(), key=lambda x: -x[1][0])[:60]: print(f"  {ms:7.3f}  {cnt/steps:6.1f}  [{cls(n)}] {n[:150]}")

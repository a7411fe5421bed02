"""Every GPU kernel of a `turbotrain profile` trace, summed per step and put in classes: library GEMM/conv/attention
(the same cuBLAS/cuDNN kernels a peer runs), inductor's Triton kernels, optimizer, other. argv: trace.json.gz steps"""
import collections, gzip, json, sys
tr = json.load(gzip.open(sys.argv[1])); steps = int(sys.argv[2])
k = collections.defaultdict(lambda: [0.0, 0])
for e in tr["traceEvents"]:
    if e.get("cat") == "kernel":
        k[e["name"]][0] += e["dur"] / 1e3 / steps; k[e["name"]][1] += 1
def cls(n):
    if n.startswith(("nvjet", "sm90_xmma", "cutlass", "ampere", "sm80")) or "gemm" in n.lower(): return "gemm (cuBLAS/CUTLASS)"
    if "cudnn" in n or "fmha" in n or "flash" in n: return "conv/attention (cuDNN/flash)"
    if "multi_tensor_apply" in n or "FusedOptimizer" in n: return "optimizer / foreach"
    if n.startswith("triton"): return "inductor Triton"
    return "other"
c = collections.defaultdict(float)
for n, (ms, _) in k.items(): c[cls(n)] += ms
tot = sum(c.values())
print(f"kernel time per step {tot:.3f} ms")
for n, ms in sorted(c.items(), key=lambda x: -x[1]): print(f"  {n:32s} {ms:7.3f} ms  {ms/tot:6.1%}")
print("\nall kernels (ms/step, launches/step):")
for n, (ms, cnt) in sorted(k.items(), key=lambda x: -x[1][0]): print(f"  {ms:7.3f}  {cnt/steps:6.1f}  [{cls(n)}] {n[:140]}")

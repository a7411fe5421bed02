"""Gaps and memsets in a chrome trace of N steps: argv trace.json steps. Where does the GPU idle between nodes?"""
import collections, json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]; steps = int(sys.argv[2])
gpu = sorted((e["ts"], e["ts"] + e["dur"], e.get("cat"), e["name"]) for e in ev
             if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
def cls(cat, n):
    if cat != "kernel": return cat
    if n.startswith(("nvjet", "sm90_xmma")) or "gemm" in n.lower(): return "gemm"
    if "splitKreduce" in n: return "splitK"
    if "cudnn" in n: return "attn"
    if n.startswith("triton"): return "triton"
    return "other"
cnt = collections.Counter(cls(c, n) for _, _, c, n in gpu)
dur = collections.Counter()
for s, e, c, n in gpu: dur[cls(c, n)] += e - s
print("per step: " + ", ".join(f"{k} {v/steps:.1f} launches {dur[k]/steps/1e3:.3f} ms" for k, v in cnt.most_common()))
gap_next, gap_prev, gap_pair = collections.Counter(), collections.Counter(), collections.Counter()
small = collections.Counter()
end, prev = gpu[0][1], gpu[0]
for s, e, c, n in gpu[1:]:
    g = s - end
    if 0 < g < 20:
        small[cls(c, n)] += 1
        gap_next[cls(c, n)] += g; gap_prev[cls(prev[2], prev[3])] += g
        gap_pair[(cls(prev[2], prev[3]), cls(c, n))] += g
    end = max(end, e); prev = (s, e, c, n)
print("gaps < 20 us by next node (ms/step):", {k: round(v / steps / 1e3, 3) for k, v in gap_next.most_common()})
print("gaps < 20 us by previous node (ms/step):", {k: round(v / steps / 1e3, 3) for k, v in gap_prev.most_common()})
print("by pair:", {f"{a}->{b}": round(v / steps / 1e3, 3) for (a, b), v in gap_pair.most_common(12)})
print("mean gap before:", {k: round(gap_next[k] / small[k], 2) for k in small})
ms = collections.Counter(n for _, _, c, n in gpu if c == "gpu_memset")
print("memsets:", {k[:40]: v / steps for k, v in ms.items()})
# the kernel that follows each memset
after = collections.Counter()
for i, (s, e, c, n) in enumerate(gpu[:-1]):
    if c == "gpu_memset":
        after[gpu[i + 1][3][:70]] += 1
print("kernel after a memset (per step):", {k: round(v / steps, 1) for k, v in after.most_common(15)})

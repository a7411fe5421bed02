"""Experiment: memset nodes of cuBLAS/cuDNN in CUDA graphs as fill kernels (accel/graph_memsets.py).
`micro`: a captured chain of GEMMs, memset nodes counted before/after, outputs compared, replays timed.
`train on|off name overrides...`: the GPT-2 preset with the rewrite on or off around train()."""
import ctypes
import statistics
import sys

import torch

sys.path.insert(0, "src")
from turbotrain.accel import graph_memsets as gm  # noqa: E402


def count(graph):
    lib = gm._lib()
    kinds = {}
    for node in gm._nodes(lib.cuGraphGetNodes, ctypes.c_void_p(graph)):
        k = ctypes.c_int(-1)
        lib.cuGraphNodeGetType(node, ctypes.byref(k))
        kinds[k.value] = kinds.get(k.value, 0) + 1
    return kinds


def micro():
    print("problem:", gm.problem())
    N, C, H = 16384, 768, 3072
    dt = torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(N, C, device="cuda", dtype=dt)
    w1, b1 = torch.randn(H, C, device="cuda", dtype=dt) * 0.02, torch.randn(H, device="cuda", dtype=dt)
    w2, b2 = torch.randn(C, H, device="cuda", dtype=dt) * 0.02, torch.randn(C, device="cuda", dtype=dt)
    sq = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(16, 12, 1024, 64, device="cuda", dtype=dt, requires_grad=True)

    def body():
        h = x
        for _ in range(12):
            h = torch.addmm(b2, torch.relu(torch.addmm(b1, h, w1.t())), w2.t()) * 0.5
        o = sq(q, q, q, is_causal=True)
        return h, o

    for _ in range(3):
        body()
    torch.cuda.synchronize()
    res = {}
    for name, on in (("plain", False), ("fills", True)):
        with gm.graph_fills(on):
            g = torch.cuda.CUDAGraph(keep_graph=True)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                body()
                torch.cuda.synchronize()
                with torch.cuda.graph(g, stream=s):
                    out = body()
            torch.cuda.current_stream().wait_stream(s)
            print(name, "node kinds (0 kernel, 2 memset):", count(g.raw_cuda_graph()), flush=True)
            g.replay()
            torch.cuda.synchronize()
            res[name] = [t.clone() for t in out]
            ts = []
            for _ in range(7):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(20):
                    g.replay()
                e1.record()
                torch.cuda.synchronize()
                ts.append(e0.elapsed_time(e1) / 20)
            print(f"{name}: replay {statistics.median(ts):.4f} ms (min {min(ts):.4f})", flush=True)
    print("equal:", all(torch.equal(a, b) for a, b in zip(res["plain"], res["fills"])))


def train(on, name, overrides):
    from turbotrain import load_config, train as tt_train
    cfg = load_config("gpt2-124m", overrides + [f"run.name={name}"])
    with gm.graph_fills(on):
        s = tt_train(cfg)
    print({k: s.get(k) for k in ("tokens_per_s", "timed_tokens_per_s", "final_loss") if k in s})


if __name__ == "__main__":
    if sys.argv[1] == "micro":
        micro()
    else:
        train(sys.argv[2] == "on", sys.argv[3], sys.argv[4:])

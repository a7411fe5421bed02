"""kernels.graph_fills on a GPU: a captured graph's small memsets become fill kernels writing the same bytes before
the same readers (the graph's outputs bit-equal to the unrewritten graph's, over replays), large ones stay memsets,
and a compiled run with CUDA graphs trains the same losses with it as without. tests/unit/test_graph_memsets.py
covers the host side."""
from __future__ import annotations

import ctypes

import pytest
import torch

from turbotrain.accel import graph_memsets as gm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or gm.problem() is not None,
                                                  reason="needs a GPU and the CUDA driver's graph API")]


def _kinds(graph) -> dict:
    lib = gm._lib()
    kinds = {}
    for node in gm._nodes(lib.cuGraphGetNodes, ctypes.c_void_p(graph.raw_cuda_graph())):
        k = ctypes.c_int(-1)
        gm._check(lib.cuGraphNodeGetType(node, ctypes.byref(k)), "node type")
        kinds[k.value] = kinds.get(k.value, 0) + 1
    return kinds


def _capture(body, on: bool):
    """(graph, outputs) of `body` captured with the rewrite on or off (the graph kept to count its nodes)."""
    for _ in range(2):
        body()
    torch.cuda.synchronize()
    with gm.graph_fills(on):
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g):
            out = body()
    return g, out


def _memset(ptr: int, value: int, count: int, width: int) -> None:
    """The driver's own memset on the current stream (captured as a memset node), `width` bytes an element."""
    lib = ctypes.CDLL("libcuda.so.1")
    fn = {1: lib.cuMemsetD8Async, 2: lib.cuMemsetD16Async, 4: lib.cuMemsetD32Async}[width]
    fn.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    stream = torch.cuda.current_stream().cuda_stream
    assert fn(ptr, value, count, stream) == 0


def test_memsets_become_fills_of_the_same_bytes_before_their_readers():
    buf = torch.full((2 * gm.MAX_BYTES,), 7, dtype=torch.uint8, device="cuda")

    def body():
        outs = []
        for value, width, count, at in ((0xAB, 1, 12, 0), (0x1234, 2, 6, 64), (0xDEADBEEF, 4, 5, 128),
                                        (0x5A, 1, gm.MAX_BYTES + 4, 1024)):  # the last: too large, stays a memset
            buf.fill_(7)
            _memset(buf.data_ptr() + at, value, count, width)
            outs.append(buf.clone())  # read right after: the fill must come before its reader
        return outs

    plain, want = _capture(body, False)
    fills, got = _capture(body, True)
    assert _kinds(plain).get(gm._MEMSET) == 4 and _kinds(fills).get(gm._MEMSET) == 1
    for g, outs in ((plain, want), (fills, got)):
        for t in outs:
            t.zero_()
        g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[0][:12].tolist() == [0xAB] * 12 and got[0][12] == 7
    assert got[1][64:76].view(torch.int16).tolist() == [0x1234] * 6
    assert got[2][128:148].view(torch.int32).tolist() == [0xDEADBEEF - 2**32] * 5


def test_library_graphs_lose_their_memsets_and_keep_their_results():
    torch.manual_seed(0)
    x = torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 768, device="cuda", dtype=torch.bfloat16) * 0.02
    b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(4, 12, 512, 64, device="cuda", dtype=torch.bfloat16)

    def body():
        h = torch.addmm(b, x, w.t())
        return h @ w, torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    plain, want = _capture(body, False)
    fills, got = _capture(body, True)
    assert _kinds(fills).get(gm._MEMSET, 0) == 0  # every library memset here is a counter of a few bytes
    for _ in range(3):
        plain.replay()
        fills.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_compiled_run_with_cuda_graphs_trains_the_same_losses(tmp_path):
    import tomllib

    from tests.helpers import losses, tiny_gpt
    from turbotrain.trainer import train

    for name, on in (("fills", "auto"), ("plain", "false")):
        train(tiny_gpt(tmp_path, "run.device=cuda", "train.steps=6", f"run.name={name!r}", "precision.dtype=bf16",
                       "compile.enabled=true", 'compile.mode="reduce-overhead"', f"kernels.graph_fills={on}"))
    cfg = tomllib.loads((tmp_path / "fills" / "config.toml").read_text())
    assert cfg["kernels"]["graph_fills"] is True
    assert torch.cuda.CUDAGraph is torch.cuda.graphs.CUDAGraph and not getattr(torch.cuda.CUDAGraph,
                                                                             "rewrites_memsets", False)
    got, ref = losses(tmp_path, "fills"), losses(tmp_path, "plain")
    # the same kernels: equal but for cuDNN attention's atomics in its backward
    assert len(got) == len(ref) == 6 and all(abs(x - y) <= 1e-4 * abs(y) for x, y in zip(got, ref)), (got, ref)

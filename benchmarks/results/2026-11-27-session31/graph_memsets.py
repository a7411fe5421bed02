"""CUDA graphs whose libraries' small memsets run as fill kernels (`compile.graph_fills`).

On Hopper, cuBLAS's cooperative GEMM kernels and cuDNN's attention kernels each zero a 4-byte counter with a
`cudaMemsetAsync` before they start. Captured into a CUDA graph (compile.mode "reduce-overhead"), each becomes a
memset node, and a memset node between two kernels leaves the GPU idle about 2 µs longer than a kernel node does
(NVIDIA's TransformerEngine measured 3.2 µs for a 4-byte memset and its gap against 0.8 µs for a fill kernel). A
GPT-2 step holds ~120 of them. Here, as each graph is captured, every small memset node is replaced by a node of
one fill kernel of our own writing the same bytes, with the same dependencies: the same memory zeroed at the same
point of the graph, without the memset's gap. Measured in docs/benchmarks.md.

While `graph_fills(True)` is in force, `torch.cuda.CUDAGraph` is a subclass that keeps the captured graph,
rewrites it after capture and instantiates it (what the base class does at the end of capture), so torch's
CUDA-graph trees (torch.compile's "reduce-overhead") and graphs of the user's own are all rewritten; outside it
torch's class is back. The graph is edited through the CUDA driver API (ctypes on libcuda, which torch loaded:
no package to install); the kernel is a few lines of PTX that the driver compiles once per device.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

import torch

from turbotrain.log import say_once

# memsets up to this size are rewritten: the counters and flags libraries zero before a kernel. A large memset
# (a buffer's zeros) is bandwidth, not latency, and stays as the driver does it
MAX_BYTES = 4096
_MEMSET = 2  # CUgraphNodeType's CU_GRAPH_NODE_TYPE_MEMSET
_BLOCK = 128
_STATE = {"on": False}
_LOCK = threading.Lock()
_CU: dict = {}  # "lib"; a CUfunction per device index

# one 32-bit word per thread: fill(dst, value, words)
_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry tt_fill32(.param .u64 dst, .param .u32 value, .param .u32 words)
{
  .reg .pred %p;
  .reg .b32 %r<6>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [dst];
  ld.param.u32 %r1, [value];
  ld.param.u32 %r2, [words];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.s32 %r3, %r3, %r4, %r5;
  setp.ge.u32 %p, %r3, %r2;
  @%p bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r3, 4;
  add.s64 %rd4, %rd2, %rd3;
  st.global.u32 [%rd4], %r1;
DONE:
  ret;
}
"""


class _MemsetParams(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("element_size", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


class _KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("params", ctypes.POINTER(ctypes.c_void_p)),
                ("extra", ctypes.POINTER(ctypes.c_void_p)), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


def graph_fills(enabled: bool) -> contextlib.AbstractContextManager:
    """`with graph_fills(True): train...` — CUDA graphs captured inside have their small memsets as fill kernels."""
    if not isinstance(enabled, int):  # bool is an int; an unresolved "auto" must not read as on
        raise TypeError(f"graph_fills(enabled) takes True or False, not {enabled!r}")
    return _patched() if enabled else contextlib.nullcontext()


@contextlib.contextmanager
def _patched():
    import torch.cuda.graphs as graphs

    before = (torch.cuda.CUDAGraph, graphs.CUDAGraph, _STATE["on"])
    torch.cuda.CUDAGraph = graphs.CUDAGraph = _graph_class(before[0])
    _STATE["on"] = True
    try:
        yield
    finally:
        torch.cuda.CUDAGraph, graphs.CUDAGraph, _STATE["on"] = before


def _graph_class(base: type) -> type:
    if base.__dict__.get("rewrites_memsets"):  # nested: already ours
        return base

    class FillsGraph(base):
        """torch.cuda.CUDAGraph that rewrites its small memset nodes as fill kernels after capture."""

        rewrites_memsets = True

        def __init__(self, keep_graph: bool = False, *args, **kwargs):
            super().__init__(True, *args, **kwargs)
            self._tt_keep = keep_graph  # the caller's wish: without it the graph is instantiated at capture end

        def capture_end(self) -> None:
            super().capture_end()
            try:
                rewrite(self.raw_cuda_graph())
            except Exception as e:  # noqa: BLE001 - each node is swapped whole: the graph stays right as it is
                say_once(f"warning: compile.graph_fills: a captured CUDA graph keeps its memsets ({e})")
            if not self._tt_keep:
                self.instantiate()

    return FillsGraph


def problem() -> str | None:
    """Why the rewrite cannot run here (the rest of a sentence after "needs"), or None."""
    if not torch.cuda.is_available():
        return "a CUDA GPU"
    if not all(hasattr(torch.cuda.CUDAGraph, a) for a in ("raw_cuda_graph", "instantiate")):
        return f"torch.cuda.CUDAGraph(keep_graph=True) (torch 2.7 or newer; this is {torch.__version__})"
    try:
        _lib()
    except Exception as e:  # no driver library, a symbol missing
        return f"the CUDA driver's graph API, which this process does not reach ({type(e).__name__}: {e})"
    return None


def _lib():
    if "lib" not in _CU:
        lib = ctypes.CDLL("libcuda.so.1")
        v, p, sz = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)
        sigs = {"cuGraphGetNodes": [v, p, sz], "cuGraphNodeGetType": [v, ctypes.POINTER(ctypes.c_int)],
                "cuGraphMemsetNodeGetParams": [v, ctypes.POINTER(_MemsetParams)],
                "cuGraphNodeGetDependencies": [v, p, sz], "cuGraphNodeGetDependentNodes": [v, p, sz],
                "cuGraphAddKernelNode_v2": [p, v, p, ctypes.c_size_t, ctypes.POINTER(_KernelParams)],
                "cuGraphAddDependencies": [v, p, p, ctypes.c_size_t], "cuGraphDestroyNode": [v],
                "cuModuleLoadData": [p, ctypes.c_char_p], "cuModuleGetFunction": [p, v, ctypes.c_char_p]}
        for name, args in sigs.items():
            fn = getattr(lib, name)  # AttributeError: a driver without it
            fn.argtypes, fn.restype = args, ctypes.c_int
        _CU["lib"] = lib
    return _CU["lib"]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"compile.graph_fills: {what} failed (CUDA driver status {status}); set "
                           "compile.graph_fills=false")


def _fill_function():
    """The fill kernel on the current device (compiled from PTX by the driver once per device)."""
    index = torch.cuda.current_device()
    if index not in _CU:
        lib, module, func = _lib(), ctypes.c_void_p(), ctypes.c_void_p()
        _check(lib.cuModuleLoadData(ctypes.byref(module), _PTX), "loading the fill kernel")
        _check(lib.cuModuleGetFunction(ctypes.byref(func), module, b"tt_fill32"), "finding the fill kernel")
        _CU[index] = func
    return _CU[index]


def fill_of(dst: int, value: int, element_size: int, width: int, height: int) -> tuple[int, int] | None:
    """(32-bit pattern, words) of a fill kernel writing what a memset node writes, or None where the memset is not
    one this rewrite takes: 2D, over MAX_BYTES, or not whole aligned 32-bit words."""
    size = width * element_size
    if height != 1 or element_size not in (1, 2, 4) or size == 0 or size > MAX_BYTES or size % 4 or dst % 4:
        return None
    # the driver takes the low element_size bytes of value, repeated over the span
    pattern = {1: (value & 0xFF) * 0x01010101, 2: (value & 0xFFFF) * 0x00010001, 4: value & 0xFFFFFFFF}[element_size]
    return pattern, size // 4


def _nodes(getter, node_or_graph) -> list:
    n = ctypes.c_size_t(0)
    _check(getter(node_or_graph, None, ctypes.byref(n)), "listing graph nodes")
    if n.value == 0:
        return []
    arr = (ctypes.c_void_p * n.value)()
    _check(getter(node_or_graph, arr, ctypes.byref(n)), "listing graph nodes")
    return list(arr[: n.value])


def rewrite(graph: int) -> int:
    """Replace the small memset nodes of a captured (not yet instantiated) CUDA graph by fill-kernel nodes with the
    same dependencies; returns how many. A node whose rewiring fails keeps its memset (the graph is never left
    without one of the two)."""
    lib = _lib()
    with _LOCK:
        func, count = _fill_function(), 0
        for node in _nodes(lib.cuGraphGetNodes, ctypes.c_void_p(graph)):
            kind = ctypes.c_int(-1)
            _check(lib.cuGraphNodeGetType(node, ctypes.byref(kind)), "reading a node's type")
            if kind.value != _MEMSET:
                continue
            params = _MemsetParams()
            _check(lib.cuGraphMemsetNodeGetParams(node, ctypes.byref(params)), "reading a memset node")
            fill = fill_of(params.dst, params.value, params.element_size, params.width, params.height)
            if fill is not None:
                count += _replace(lib, ctypes.c_void_p(graph), ctypes.c_void_p(node), func, params.dst, *fill)
    if count:
        say_once("compile: CUDA graphs run the libraries' small memsets as fill kernels (compile.graph_fills)")
    return count


def _replace(lib, graph, node, func, dst: int, pattern: int, words: int) -> int:
    deps = _nodes(lib.cuGraphNodeGetDependencies, node)
    after = _nodes(lib.cuGraphNodeGetDependentNodes, node)
    args = (ctypes.c_uint64(dst), ctypes.c_uint32(pattern), ctypes.c_uint32(words))
    argv = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args))
    block = min(_BLOCK, 32 * -(-words // 32))
    kp = _KernelParams(func=func.value, grid=(ctypes.c_uint * 3)(-(-words // block), 1, 1),
                       block=(ctypes.c_uint * 3)(block, 1, 1), shared=0,
                       params=ctypes.cast(argv, ctypes.POINTER(ctypes.c_void_p)))
    dep_arr = (ctypes.c_void_p * max(len(deps), 1))(*deps)
    new = ctypes.c_void_p()
    if lib.cuGraphAddKernelNode_v2(ctypes.byref(new), graph, dep_arr, len(deps), ctypes.byref(kp)) != 0:
        return 0
    for d in after:  # the kernel before everything that waited on the memset, then the memset goes
        if lib.cuGraphAddDependencies(graph, ctypes.byref(new), ctypes.byref(ctypes.c_void_p(d)), 1) != 0:
            lib.cuGraphDestroyNode(new)  # its edges go with it: the memset stays as captured
            return 0
    _check(lib.cuGraphDestroyNode(node), "removing a memset node")
    return 1

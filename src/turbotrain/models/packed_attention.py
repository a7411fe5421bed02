"""Attention over a fused qkv projection with its gradient written in place (`kernels.packed_attention`).

A block that projects q, k and v with one linear layer and splits the result pays, in backward, for a copy of
the whole qkv gradient: SDPA returns dq, dk and dv as three tensors, and the split's backward concatenates them
for the linear's matmuls (its cost: benchmarks/NOTES.md).
Here cuDNN's fused attention runs through cudnn-frontend's graph API, which takes any strides for its outputs:
dq, dk and dv are written straight into one (B, T, 3C) buffer, the layout the linear's backward reads. The
kernels are the ones torch's SDPA runs on Hopper (cuDNN's flash attention), so the values are the same; only the
copy goes.

Models opt in by calling `qkv_attention(qkv, n_head)` where they would split and call SDPA (turbotrain's GPT
blocks do). It runs the packed op while `packed_attention(True)` is in force on a CUDA tensor of bf16/fp16
without dropout, and torch's SDPA otherwise, so the model is the same model everywhere.

The ops are `torch.library.custom_op`s with a fake implementation and their autograd formula registered on the
op, so `torch.compile(fullgraph=True)` keeps them as single nodes, and CUDA graphs capture them (the cuDNN handle
runs on the caller's current stream, set at each call).
"""
from __future__ import annotations

import contextlib
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

from turbotrain.models.structure import op_switch

_STATE = {"on": False}
_HANDLES: dict[int, object] = {}
_GRAPHS: OrderedDict[tuple, tuple] = OrderedDict()  # built graphs, most recent last
MAX_GRAPHS = 64  # shapes kept (each a built cuDNN plan): a varying batch or sequence length builds more
EXTRA_HINT = "pip install 'turbotrain[cudnn]' (nvidia-cudnn-frontend)"


def frontend_problem() -> str | None:
    """Why cudnn-frontend cannot be used here (the rest of a sentence after "needs"), or None."""
    try:
        import cudnn  # noqa: F401
    except Exception as e:  # ImportError, or a library it loads failing to load
        return f"cudnn-frontend, which does not import here ({type(e).__name__}: {e}): {EXTRA_HINT}"
    return None


def packed_attention(enabled: bool) -> contextlib.AbstractContextManager:
    """`with packed_attention(True): train...` — `qkv_attention` calls run the packed op where it applies."""
    return op_switch(_STATE, enabled, "packed_attention")


def qkv_attention(qkv: torch.Tensor, n_head: int, dropout_p: float = 0.0) -> torch.Tensor:
    """Causal self-attention of a fused projection: qkv (B, T, 3C) holding [q | k | v] → (B, T, C), heads of
    C / n_head. The same values as splitting qkv and calling `F.scaled_dot_product_attention(is_causal=True)`."""
    if qkv.dim() != 3 or qkv.shape[-1] % 3 or (qkv.shape[-1] // 3) % n_head:
        raise ValueError(f"qkv_attention takes qkv of shape (B, T, 3C) with C divisible by n_head = {n_head}; "
                         f"got {tuple(qkv.shape)}")
    b, t, c3 = qkv.shape
    if _STATE["on"] and qkv.is_cuda and qkv.dtype in (torch.bfloat16, torch.float16) and dropout_p == 0.0 \
            and head_dim_ok(c3 // 3 // n_head):
        return torch.ops.turbotrain.qkv_attention(qkv.contiguous(), n_head)[0]
    q, k, v = (z.transpose(1, 2) for z in qkv.view(b, t, 3, n_head, c3 // 3 // n_head).unbind(2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    return y.transpose(1, 2).reshape(b, t, c3 // 3)


def callers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of `model` that call qkv_attention (they say so: `calls_qkv_attention = True`)."""
    return [m for m in model.modules() if getattr(m, "calls_qkv_attention", False)]


def head_dim_ok(d: int) -> bool:
    """Head sizes cuDNN's fused attention takes on every GPU it runs on (others run torch's SDPA)."""
    return d % 8 == 0 and 8 <= d <= 128


def _handle():
    import cudnn

    dev = torch.cuda.current_device()
    if dev not in _HANDLES:
        _HANDLES[dev] = cudnn.create_handle()
    cudnn.set_stream(handle=_HANDLES[dev], stream=torch.cuda.current_stream().cuda_stream)
    return _HANDLES[dev]


def _heads(z: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, C) → the (B, H, T, D) view cuDNN is told about."""
    b, t, c = z.shape
    return z.view(b, t, n_head, c // n_head).transpose(1, 2)


def _qkv_views(qkv: torch.Tensor, n_head: int) -> list[torch.Tensor]:
    b, t, c3 = qkv.shape
    return [z.transpose(1, 2) for z in qkv.view(b, t, 3, n_head, c3 // 3 // n_head).unbind(2)]


def _graph(kind: str, b: int, t: int, h: int, d: int, dtype: torch.dtype) -> tuple:
    """A built cuDNN graph (forward: q, k, v → o, stats; backward: + o, do, stats → dq, dk, dv), its tensors and
    workspace size; built once per shape."""
    key = (kind, b, t, h, d, dtype, torch.cuda.current_device())
    if key in _GRAPHS:
        _GRAPHS.move_to_end(key)
    else:
        while len(_GRAPHS) >= MAX_GRAPHS:
            _GRAPHS.popitem(last=False)
        try:
            _GRAPHS[key] = _build(kind, b, t, h, d, dtype)
        except Exception as e:  # cudnn-frontend's errors: no kernel for this shape, GPU or library version
            from turbotrain.errors import UserError

            raise UserError(f"kernels.packed_attention: cuDNN has no attention kernel here for batch {b}, {h} heads "
                            f"of {d}, {t} tokens, {str(dtype).removeprefix('torch.')} ({type(e).__name__}: "
                            f"{str(e).strip().splitlines()[0] if str(e).strip() else 'no message'}); set "
                            "kernels.packed_attention=false") from e
    return _GRAPHS[key]


def _build(kind: str, b: int, t: int, h: int, d: int, dtype: torch.dtype) -> tuple:
    import cudnn

    io = cudnn.data_type.BFLOAT16 if dtype == torch.bfloat16 else cudnn.data_type.HALF
    f32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=_handle())
    dims, c = [b, h, t, d], h * d
    qkv_stride, o_stride, st_stride = [t * 3 * c, d, 3 * c, 1], [t * c, d, c, 1], [h * t, t, 1, 1]
    q, k, v = (g.tensor(name=n, dim=dims, stride=qkv_stride, data_type=io) for n in "qkv")
    scale = 1.0 / math.sqrt(d)
    if kind == "fwd":
        o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=scale, use_causal_mask=True)
        o.set_output(True).set_dim(dims).set_stride(o_stride).set_data_type(io)
        stats.set_output(True).set_dim([b, h, t, 1]).set_stride(st_stride).set_data_type(f32)
        tensors = (q, k, v, o, stats)
    else:
        o = g.tensor(name="o", dim=dims, stride=o_stride, data_type=io)
        do = g.tensor(name="do", dim=dims, stride=o_stride, data_type=io)
        stats = g.tensor(name="stats", dim=[b, h, t, 1], stride=st_stride, data_type=f32)
        grads = g.sdpa_backward(name="sdpa_bwd", q=q, k=k, v=v, o=o, dO=do, stats=stats, attn_scale=scale,
                                use_causal_mask=True)
        for z in grads:  # into the qkv-shaped gradient: the point of this op
            z.set_output(True).set_dim(dims).set_stride(qkv_stride).set_data_type(io)
        tensors = (q, k, v, o, do, stats, *grads)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, tensors, g.get_workspace_size()


def _run(g, pack: dict, workspace: int, device: torch.device) -> None:
    work = torch.empty(max(workspace, 1), device=device, dtype=torch.uint8)
    g.execute(pack, work, handle=_handle())


@torch.library.custom_op("turbotrain::qkv_attention", mutates_args=())
def _forward(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, T, C), softmax statistics (B, H, T, 1) fp32) of causal attention over packed qkv."""
    b, t, c3 = qkv.shape
    with torch.cuda.device(qkv.device):  # the handle and plans are the tensor's GPU's, whichever is current
        g, (q, k, v, o, stats), ws = _graph("fwd", b, t, n_head, c3 // 3 // n_head, qkv.dtype)
        out = qkv.new_empty(b, t, c3 // 3)
        st = torch.empty(b, n_head, t, 1, device=qkv.device, dtype=torch.float32)
        qv, kv, vv = _qkv_views(qkv, n_head)
        _run(g, {q: qv, k: kv, v: vv, o: _heads(out, n_head), stats: st}, ws, qkv.device)
    return out, st


@_forward.register_fake
def _(qkv, n_head):
    b, t, c3 = qkv.shape
    return qkv.new_empty(b, t, c3 // 3), qkv.new_empty(b, n_head, t, 1, dtype=torch.float32)


@torch.library.custom_op("turbotrain::qkv_attention_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, st: torch.Tensor,
                 n_head: int) -> torch.Tensor:
    """d loss / d qkv, in qkv's own (B, T, 3C) layout."""
    b, t, c3 = qkv.shape
    with torch.cuda.device(qkv.device):
        g, (q, k, v, o, do, stats, dq, dk, dv), ws = _graph("bwd", b, t, n_head, c3 // 3 // n_head, qkv.dtype)
        dqkv = torch.empty_like(qkv)
        qv, kv, vv = _qkv_views(qkv, n_head)
        dqv, dkv, dvv = _qkv_views(dqkv, n_head)
        pack = {q: qv, k: kv, v: vv, o: _heads(out, n_head), do: _heads(dout.contiguous(), n_head), stats: st,
                dq: dqv, dk: dkv, dv: dvv}
        _run(g, pack, ws, qkv.device)
    return dqkv


@_backward_op.register_fake
def _(dout, qkv, out, st, n_head):
    return torch.empty_like(qkv)


def _setup_context(ctx, inputs, output) -> None:
    qkv, n_head = inputs
    out, st = output
    ctx.save_for_backward(qkv, out, st)
    ctx.n_head = n_head


def _autograd(ctx, dout, dst):
    qkv, out, st = ctx.saved_tensors
    return torch.ops.turbotrain.qkv_attention_backward(dout, qkv, out, st, ctx.n_head), None


torch.library.register_autograd("turbotrain::qkv_attention", _autograd, setup_context=_setup_context)
QKV_ATTENTION_OP = torch.ops.turbotrain.qkv_attention.default  # what selective checkpointing keeps

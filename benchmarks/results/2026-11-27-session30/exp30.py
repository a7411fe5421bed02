"""Experiment: every cuDNN execution plan for GPT-2's causal attention (16 x 1,024 tokens, 12 heads of 64, bf16),
forward and backward with dq/dk/dv written into one qkv-shaped buffer (models/packed_attention.py's graphs), timed
with CUDA events: is there a plan faster than the heuristic's first?"""
import math
import sys

import torch

sys.path.insert(0, "src")
import cudnn  # noqa: E402

from turbotrain.models import packed_attention as pa  # noqa: E402

print("graph methods:", [m for m in dir(cudnn.pygraph) if "plan" in m.lower() or "exec" in m.lower()])
print("policies:", [x for x in dir(cudnn) if "policy" in x.lower() or "heur" in x.lower()])
b, t, h, d, dt = 16, 1024, 12, 64, torch.bfloat16
c = h * d


def build(kind):
    io, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=pa._handle())
    dims = [b, h, t, d]
    qkv_stride, o_stride, st_stride = [t * 3 * c, d, 3 * c, 1], [t * c, d, c, 1], [h * t, t, 1, 1]
    q, k, v = (g.tensor(name=n, dim=dims, stride=qkv_stride, data_type=io) for n in "qkv")
    scale = 1.0 / math.sqrt(d)
    if kind == "fwd":
        o, st = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=scale, use_causal_mask=True)
        o.set_output(True).set_dim(dims).set_stride(o_stride).set_data_type(io)
        st.set_output(True).set_dim([b, h, t, 1]).set_stride(st_stride).set_data_type(f32)
        ts = (q, k, v, o, st)
    else:
        o = g.tensor(name="o", dim=dims, stride=o_stride, data_type=io)
        do = g.tensor(name="do", dim=dims, stride=o_stride, data_type=io)
        st = g.tensor(name="stats", dim=[b, h, t, 1], stride=st_stride, data_type=f32)
        grads = g.sdpa_backward(name="sdpa_bwd", q=q, k=k, v=v, o=o, dO=do, stats=st, attn_scale=scale,
                                use_causal_mask=True)
        for z in grads:
            z.set_output(True).set_dim(dims).set_stride(qkv_stride).set_data_type(io)
        ts = (q, k, v, o, do, st, *grads)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    return g, ts


torch.manual_seed(0)
qkv = torch.randn(b, t, 3 * c, device="cuda", dtype=dt)
o = torch.empty(b, t, c, device="cuda", dtype=dt)
st = torch.empty(b, h, t, 1, device="cuda", dtype=torch.float32)
do = torch.randn(b, t, c, device="cuda", dtype=dt)
dqkv = torch.empty_like(qkv)
views = lambda z: [z[..., i * c:(i + 1) * c].view(b, t, h, d).transpose(1, 2) for i in range(3)]  # noqa: E731
for kind in ("fwd", "bwd"):
    g, ts = build(kind)
    n = g.get_execution_plan_count()
    qv, kv, vv = views(qkv)
    if kind == "fwd":
        pack = {ts[0]: qv, ts[1]: kv, ts[2]: vv, ts[3]: o.view(b, t, h, d).transpose(1, 2), ts[4]: st}
        outs = [o]
    else:
        dq, dk, dv = views(dqkv)
        pack = {ts[0]: qv, ts[1]: kv, ts[2]: vv, ts[3]: o.view(b, t, h, d).transpose(1, 2),
                ts[4]: do.view(b, t, h, d).transpose(1, 2), ts[5]: st, ts[6]: dq, ts[7]: dk, ts[8]: dv}
        outs = [dqkv]
    ref = None
    for i in range(n):
        ws = g.get_workspace_size_plan_at_index(i)
        work = torch.empty(max(ws, 1), device="cuda", dtype=torch.uint8)
        try:
            for _ in range(3):
                g.execute_plan_at_index(pack, work, i, handle=pa._handle())
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(20):
                g.execute_plan_at_index(pack, work, i, handle=pa._handle())
            e1.record()
            torch.cuda.synchronize()
            out = outs[0].clone()
            ref = out if ref is None else ref
            diff = (out.float() - ref.float()).abs().max().item()
            print(f"{kind} plan {i}: {e0.elapsed_time(e1) / 20:.4f} ms, workspace {ws}, max diff to plan 0 {diff:.3g}")
        except Exception as e:  # noqa: BLE001
            print(f"{kind} plan {i}: failed {type(e).__name__}: {str(e)[:120]}")

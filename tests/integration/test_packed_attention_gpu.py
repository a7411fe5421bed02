"""kernels.packed_attention on a GPU (cudnn-frontend installed): the packed op gives SDPA's values and gradients
(the same cuDNN kernels; only the gradient's layout differs), and a compiled GPT with CUDA graphs trains the same
loss curve with it as without. tests/unit/test_packed_attention.py covers the CPU side."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from turbotrain.models import gpt
from turbotrain.models import packed_attention as pa

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper or newer GPU"),
              pytest.mark.skipif(importlib.util.find_spec("cudnn") is None, reason="needs cudnn-frontend")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_op_matches_sdpa(dtype):
    torch.manual_seed(0)
    b, t, h, d = 2, 256, 4, 64
    qkv = torch.randn(b, t, 3 * h * d, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(b, t, h * d, device="cuda", dtype=dtype)
    ref = pa.qkv_attention(qkv, h)  # the setting is off: SDPA over the split views
    (g_ref,) = torch.autograd.grad(ref, qkv, dy)
    with pa.packed_attention(True):
        out = pa.qkv_attention(qkv, h)
    (g,) = torch.autograd.grad(out, qkv, dy)
    assert g.shape == qkv.shape and g.is_contiguous()
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(g, g_ref, atol=2e-3, rtol=2e-3)


def _losses(packed: bool) -> list[float]:
    torch.manual_seed(0)
    m = gpt.build(vocab_size=512, block_size=128, n_layer=2, n_head=4, n_embd=256).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    step_model = torch.compile(m, mode="reduce-overhead", fullgraph=True)
    idx = torch.randint(0, 512, (4, 129), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    out = []
    with pa.packed_attention(packed):
        for _ in range(4):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(step_model(idx[:, :-1]).flatten(0, 1).float(), idx[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.item())
    return out


def test_compiled_gpt_with_cuda_graphs_trains_the_same():
    base, packed = _losses(False), _losses(True)
    assert all(abs(a - b) <= 2e-3 * abs(a) for a, b in zip(base, packed)), (base, packed)
    assert packed[-1] < packed[0]


def test_head_sizes_cudnn_lacks_run_sdpa():
    """A head of 12 is outside head_dim_ok's range: with the setting on it runs torch's SDPA, the same values."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 64, 3 * 4 * 12, device="cuda", dtype=torch.bfloat16)
    ref = pa.qkv_attention(qkv, 4)
    with pa.packed_attention(True):
        assert torch.equal(pa.qkv_attention(qkv, 4), ref)

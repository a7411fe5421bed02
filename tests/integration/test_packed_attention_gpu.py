"""kernels.packed_attention on a GPU (cudnn-frontend installed): the packed op gives SDPA's values and gradients
(the same cuDNN kernels; only the gradient's layout differs), and a compiled GPT with CUDA graphs trains the same
loss curve with it as without. tests/unit/test_packed_attention.py covers the CPU side."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from turbotrain.models import packed_attention as pa

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper or newer GPU"),
              pytest.mark.skipif(importlib.util.find_spec("cudnn") is None, reason="needs cudnn-frontend")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_op_matches_sdpa(dtype):
    """The same cuDNN kernels, but SDPA over the split views may pick another engine: each is held to the fp64
    reference, the packed op within SDPA's own error (bf16 differs by an ulp at a few elements)."""
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
    x64 = qkv.detach().double().requires_grad_()
    y64 = pa.qkv_attention(x64, h)
    (g64,) = torch.autograd.grad(y64, x64, dy.double())

    def err(a, r):
        return ((a.double() - r).norm() / r.norm()).item()
    assert err(out, y64) <= 1.1 * err(ref, y64) + 1e-6, (err(out, y64), err(ref, y64))
    assert err(g, g64) <= 1.1 * err(g_ref, g64) + 1e-6, (err(g, g64), err(g_ref, g64))
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=2e-2)
    torch.testing.assert_close(g, g_ref, atol=1e-2, rtol=2e-2)


def test_a_run_with_packed_attention_measures_no_sdpa_call(tmp_path, capsys):
    """The preset's kernels.attention = "auto" with packed attention on: the GPT's attention is the packed op's, so
    the measurement finds no SDPA call and keeps torch's order; config.toml shows the switch on."""
    import tomllib

    from tests.helpers import tiny_gpt
    from turbotrain.trainer import train

    train(tiny_gpt(tmp_path, "kernels.attention=auto", "precision.dtype=bf16", "run.device=cuda", "train.steps=2",
                   "model.args.n_embd=128", "model.args.n_head=2"))
    assert "attention: the model makes no scaled_dot_product_attention call" in capsys.readouterr().out
    kernels = tomllib.loads((tmp_path / "gpt2-124m" / "config.toml").read_text())["kernels"]
    assert kernels["packed_attention"] is True and kernels["attention"] == "default"


def _losses(packed: bool) -> list[float]:
    from tests.helpers import compiled_gpt_losses

    return compiled_gpt_losses(pa.packed_attention(packed), steps=4)


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

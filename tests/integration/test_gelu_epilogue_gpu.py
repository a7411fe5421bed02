"""kernels.gelu_epilogue on a GPU: cuBLASLt's GELU and GELU-gradient epilogues give the plain MLP's values and
gradients within bf16's own error (held to an fp64 reference), a compiled GPT with CUDA graphs trains the same loss
curve with them as without, and a run with the preset's settings turns them on. tests/unit/test_gelu_epilogue.py
covers the CPU side (the ops' layouts and autograd against an emulated GEMM)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from turbotrain.models import gelu_epilogue as ge

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper or newer GPU")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [4096, 1000])  # 1000 rows: a token count that is no multiple of a tile
def test_epilogue_mlp_matches_the_plain_mlp(dtype, n):
    torch.manual_seed(0)
    c, h = 256, 1024
    fc, out = torch.nn.Linear(c, h).cuda(), torch.nn.Linear(h, c).cuda()
    x = torch.randn(n, c, device="cuda", requires_grad=True)
    dy = torch.randn(n, c, device="cuda", dtype=dtype)
    params = (x, fc.weight, fc.bias, out.weight, out.bias)

    def run(on):
        with ge.gelu_epilogue(on), torch.autocast("cuda", dtype=dtype):
            y = ge.gelu_mlp(x, fc, out)
        return (y, *torch.autograd.grad(y, params, dy))

    ref, got = run(False), run(True)
    p64 = [p.detach().double().requires_grad_() for p in params]
    y64 = F.linear(F.gelu(F.linear(p64[0], p64[1], p64[2]), approximate="tanh"), p64[3], p64[4])
    r64 = (y64, *torch.autograd.grad(y64, p64, dy.double()))

    def err(a, r):
        return ((a.double() - r).norm() / r.norm()).item()

    for name, a, b, r in zip(("y", "dx", "dW1", "db1", "dW2", "db2"), got, ref, r64):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert err(a, r) <= 1.5 * err(b, r) + 1e-3, (name, err(a, r), err(b, r))


def _losses(on: bool) -> list[float]:
    from tests.helpers import compiled_gpt_losses

    return compiled_gpt_losses(ge.gelu_epilogue(on), steps=6)


def test_compiled_gpt_with_cuda_graphs_trains_the_same():
    base, fused = _losses(False), _losses(True)
    assert all(abs(a - b) <= 5e-3 * abs(a) for a, b in zip(base, fused)), (base, fused)
    assert fused[-1] < fused[0]


def test_a_gpu_run_turns_it_on(tmp_path):
    import tomllib

    from tests.helpers import tiny_gpt
    from turbotrain.trainer import train

    train(tiny_gpt(tmp_path, "precision.dtype=bf16", "run.device=cuda", "train.steps=3", "model.args.n_embd=128",
                   "model.args.n_head=2"))
    kernels = tomllib.loads((tmp_path / "gpt2-124m" / "config.toml").read_text())["kernels"]
    assert kernels["gelu_epilogue"] is True


def test_sizes_the_epilogue_does_not_take_run_the_plain_mlp():
    torch.manual_seed(0)
    fc, out = torch.nn.Linear(36, 100).cuda(), torch.nn.Linear(100, 36).cuda()
    x = torch.randn(64, 36, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = ge.gelu_mlp(x, fc, out)
        with ge.gelu_epilogue(True):
            assert torch.equal(ge.gelu_mlp(x, fc, out), ref)

"""models/cublaslt.matmul on a GPU: the LM head's two GEMMs (logits = h W^T in bf16; the weight gradient dlogits^T h
into fp32, written or accumulated) equal torch's within its own rounding, whichever algorithm the timing keeps; a
shape first met inside a CUDA-graph capture runs the first choice and replays; the choice stays the same."""
from __future__ import annotations

import pytest
import torch

from turbotrain.models import cublaslt as lt

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or lt.problem() is not None,
                                                  reason="needs a GPU with cuBLASLt")]
S = "kernels.fused_loss"
lt_fastest = lt._fastest


def _close(got, want, rel):
    err = (got.float() - want.float()).abs().max().item()
    assert err <= rel * want.float().abs().max().item(), err


def test_the_heads_gemms_equal_torchs():
    torch.manual_seed(0)
    h = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16) * 0.02
    logits = torch.empty(1024, 4096, device="cuda", dtype=torch.bfloat16)
    assert lt.matmul(logits, h, w, a_t=False, b_t=True, accumulate=False, setting=S)
    _close(logits, h.float() @ w.float().t(), 1e-2)
    gw = torch.full((4096, 768), float("nan"), device="cuda")
    assert lt.matmul(gw, logits, h, a_t=True, b_t=False, accumulate=False, setting=S)  # beta 0: NaN never read
    want = logits.float().t() @ h.float()
    _close(gw, want, 1e-4)
    assert lt.matmul(gw, logits, h, a_t=True, b_t=False, accumulate=True, setting=S)
    _close(gw, 2 * want, 1e-4)
    again = torch.empty_like(logits)
    assert lt.matmul(again, h, w, a_t=False, b_t=True, accumulate=False, setting=S)
    assert torch.equal(again, logits)  # the kept algorithm, the same bits


def test_a_product_big_enough_is_timed_and_keeps_its_choice(monkeypatch):
    timed = []
    monkeypatch.setattr(lt, "_PLANS", {})  # a fresh plan whatever ran before in this process
    monkeypatch.setattr(lt, "_fastest", lambda *args: timed.append(1) or lt_fastest(*args))
    torch.manual_seed(3)
    h = torch.randn(8192, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(50304, 768, device="cuda", dtype=torch.bfloat16) * 0.02
    logits = torch.empty(8192, 50304, device="cuda", dtype=torch.bfloat16)
    assert 2 * 8192 * 50304 * 768 >= lt.MIN_TIMED_FLOP
    assert lt.matmul(logits, h, w, a_t=False, b_t=True, accumulate=False, setting=S)
    plans = [p for key, p in lt._PLANS.items() if key[2:5] == (50304, 8192, 768)]
    assert len(plans) == 1 and len(plans[0][4]) == 1 and timed == [1]  # timed once, one algorithm kept
    _close(logits[:256], h[:256].float() @ w.float().t(), 1e-2)
    again = torch.empty_like(logits)
    assert lt.matmul(again, h, w, a_t=False, b_t=True, accumulate=False, setting=S)
    assert torch.equal(again, logits) and timed == [1]  # the kept choice, not timed again


def test_an_accumulating_call_on_a_new_shape_keeps_the_accumulator():
    """First met with accumulate: the first choice, untimed (timing would write over the accumulator)."""
    torch.manual_seed(4)
    d = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(d.shape[0], 768, device="cuda", dtype=torch.bfloat16)
    acc = torch.randn(4096, 768, device="cuda")
    want = acc + d.float().t() @ h.float()
    assert lt.matmul(acc, d, h, a_t=True, b_t=False, accumulate=True, setting=S)
    _close(acc, want, 1e-4)


@pytest.mark.parametrize("n", [1000, 1003])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_fused_loss_in_chunks_equals_cross_entropy(n, dtype):
    """Several chunks of 256 tokens: the weight gradient accumulated by cuBLASLt over the chunks, a last chunk of
    232 rows (1000) or of 235, which cuBLASLt does not take (1003): torch's GEMMs for it."""
    from turbotrain.accel.fused_loss import fused_linear_cross_entropy

    torch.manual_seed(5)
    h = torch.randn(n, 768, device="cuda", requires_grad=True)
    w = (torch.randn(4096, 768, device="cuda") * 0.05).requires_grad_()
    y = torch.randint(0, 4096, (n,), device="cuda")
    y[::7] = -100
    with torch.autocast("cuda", dtype=dtype):
        loss = fused_linear_cross_entropy(h, w, y, chunk_tokens=256)
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    with torch.autocast("cuda", dtype=dtype):
        ref = torch.nn.functional.cross_entropy((h @ w.t()).float(), y)
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 2e-3 * abs(ref.item())
    _close(gh, h.grad, 2e-2)
    _close(gw, w.grad, 2e-2)


def test_a_shape_first_met_in_a_capture_runs_the_first_choice_and_replays():
    torch.manual_seed(1)
    h = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(512, 2048, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        assert lt.matmul(out, h, w, a_t=False, b_t=True, accumulate=False, setting=S)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    _close(out, h.float() @ w.float().t(), 1e-2)


def test_the_fused_loss_on_a_gpu_still_equals_cross_entropy():
    from turbotrain.accel.fused_loss import fused_linear_cross_entropy

    torch.manual_seed(2)
    h = torch.randn(2048, 768, device="cuda", requires_grad=True)
    w = (torch.randn(8192, 768, device="cuda") * 0.02).requires_grad_()
    y = torch.randint(0, 8192, (2048,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fused_linear_cross_entropy(h, w, y)
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = torch.nn.functional.cross_entropy((h @ w.t()).float(), y)
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 2e-3 * abs(ref.item())
    _close(gh, h.grad, 2e-2)
    _close(gw, w.grad, 2e-2)

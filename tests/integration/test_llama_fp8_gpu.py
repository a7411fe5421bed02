"""FP8 training on an FP8 GPU (sm89+, torchao installed): the FP8 model's loss and gradients track bf16's,
and a 2-layer model of llama-1b's width trains through `turbotrain.train` with precision.fp8 and compile on.
Skipped elsewhere (tests/unit/test_llama.py covers the refusals)."""
from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
import torch.nn.functional as F

from turbotrain.config import load_config
from turbotrain.models import llama

FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not FP8_GPU, reason="needs an FP8 GPU (sm89+)"),
              pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao")]


@pytest.mark.parametrize("recipe,head", [("tensorwise", False), ("rowwise", False), ("tensorwise", True)])
def test_fp8_tracks_bf16(recipe, head):
    """The head case (precision.fp8_head) converts the tied 2048 x 4096 output layer too; the tie must hold."""
    from turbotrain.accel.fp8 import apply_fp8

    def loss_and_grads(fp8: str):
        torch.manual_seed(0)
        m = llama.build(vocab_size=4096, block_size=256, n_layer=2, n_head=16, n_kv_head=4, n_embd=2048,
                        ffn_hidden=8192).cuda()
        tied = m.head.weight is m.tok_emb.weight
        assert apply_fp8(m, fp8, fsdp=False, head=head and fp8 != "off") > 0 or fp8 == "off"
        assert (m.head.weight is m.tok_emb.weight) == tied
        if head and fp8 != "off":
            assert type(m.head).__name__ == "Float8Linear"
        # 4 x 256 rows: FP8 matmuls need every dimension a multiple of 16, the tokens too
        idx = torch.randint(0, 4096, (4, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(m(idx[:, :-1]).flatten(0, 1).float(), idx[:, 1:].flatten())
        loss.backward()
        return loss.item(), torch.cat([p.grad.flatten().float() for p in m.parameters()])

    ref_loss, ref_grad = loss_and_grads("off")
    loss, grad = loss_and_grads(recipe)
    assert loss == pytest.approx(ref_loss, rel=0.01)
    assert F.cosine_similarity(grad, ref_grad, dim=0).item() > 0.98


HEAD_ON = ["precision.fp8_head=true", "kernels.fused_loss=false"]  # the fused loss would compute the head in bf16


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "tensorwise+head"])
def test_fp8_llama_trains_compiled(tmp_path, recipe):
    """llama-1b's wiring (compile, fused AdamW, bf16) with 2 layers, on a stream where each token fixes the next
    ((t + 7) mod 512): the loss must fall well below ln(512) = 6.24."""
    from turbotrain import train
    from turbotrain.data.datasets import TokenWindows

    stream = TokenWindows((torch.arange(64 * 2048 + 1) * 7 % 512).to(torch.int32), 2048, vocab_size=512)
    cfg = load_config("llama-1b", ["model.args.n_layer=2", "model.args.vocab_size=512", "data.args.vocab_size=512",
                                   "train.steps=20", "train.lr=1e-3", "train.log_every=1", "train.warmup_steps=2",
                                   f'precision.fp8="{recipe.removesuffix("+head")}"', f"run.out_dir={str(tmp_path)!r}",
                                   "data.eval_batches=0", *(HEAD_ON if "+head" in recipe else [])])
    train(cfg, train_data=stream)
    rows = [json.loads(line) for line in open(tmp_path / "llama-1b" / "metrics.jsonl")]
    loss = [r["loss"] for r in rows if "loss" in r]
    assert len(loss) == 20 and all(math.isfinite(x) for x in loss), loss
    assert sum(loss[-3:]) / 3 < loss[0] - 1.0, loss


@pytest.mark.parametrize("compiled", [False, True])
def test_fp8_rows_not_a_multiple_of_16_is_one_user_error(tmp_path, compiled):
    """4 x 255 tokens: torch._scaled_mm refuses the grad-weight matmul; the run ends with the UserError naming
    the fix (not a traceback, not a fall back to eager)."""
    from turbotrain import train
    from turbotrain.data.datasets import TokenWindows
    from turbotrain.errors import UserError

    stream = TokenWindows((torch.arange(64 * 255 + 1) * 7 % 512).to(torch.int32), 255, vocab_size=512)
    cfg = load_config("llama-1b", ["model.args.n_layer=2", "model.args.vocab_size=512", "data.args.vocab_size=512",
                                   "model.args.block_size=255", "train.steps=2", 'precision.fp8="tensorwise"',
                                   f"compile.enabled={str(compiled).lower()}", f"run.out_dir={str(tmp_path)!r}",
                                   "data.eval_batches=0"])
    with pytest.raises(UserError, match="multiple of 16"):
        train(cfg, train_data=stream)

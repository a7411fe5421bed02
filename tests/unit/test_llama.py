"""The Llama model (models/llama.py) by facts that must hold, a tiny one training through `turbotrain.train`,
and the FP8 refusals (accel/fp8.py) on a machine without an FP8 GPU."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from turbotrain.accel.fp8 import require_torchao
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.models import llama

TINY = dict(vocab_size=61, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, rope_theta=1e4)
TINY_ARGS = ["model.args.n_layer=2", "model.args.n_head=4", "model.args.n_kv_head=2", "model.args.n_embd=32",
             "model.args.ffn_hidden=64", "model.args.block_size=32", "model.args.vocab_size=64",
             "model.args.rope_theta=10000.0", "data.args.seq_len=32", "data.args.vocab_size=64", "data.args.size=256",
             "data.batch_size=8", "data.eval_batches=0", "precision.dtype=\"fp32\"", "compile.enabled=false",
             "train.optimizer_impl=\"auto\"", "run.device=\"cpu\"", "data.num_workers=0"]


@pytest.fixture(autouse=True)
def _keep_sys_path(monkeypatch):
    """The CLI puts the config's folder and the cwd first on sys.path: undo it after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def tiny(**kw) -> llama.Llama:
    torch.manual_seed(0)
    return llama.build(**{**TINY, **kw})


def test_shapes_and_hidden_head_protocol():
    m = tiny().eval()
    idx = torch.randint(0, 61, (3, 16))
    h = m.hidden(idx)
    assert h.shape == (3, 16, 32) and m(idx).shape == (3, 16, 61)
    assert isinstance(m.head, torch.nn.Linear)
    torch.testing.assert_close(m(idx), m.head(h), rtol=0, atol=0)


def test_causal_future_tokens_do_not_change_the_past():
    m = tiny().eval()
    a = torch.randint(0, 61, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 61
    torch.testing.assert_close(m(a)[:, :10], m(b)[:, :10])
    assert not torch.allclose(m(a)[:, 10:], m(b)[:, 10:])


def test_gqa_equals_attention_with_repeated_kv():
    """SDPA's enable_gqa must compute exactly the attention of the key/value heads repeated per group."""
    m = tiny().eval()
    attn = m.blocks[0].attn
    x = torch.randn(2, 16, 32)
    cos, sin = m.rope_cos[:16], m.rope_sin[:16]
    q = attn.wq(x).view(2, 16, 4, 8).transpose(1, 2)
    k = attn.wk(x).view(2, 16, 2, 8).transpose(1, 2)
    v = attn.wv(x).view(2, 16, 2, 8).transpose(1, 2)
    q, k = llama.apply_rope(q, cos, sin), llama.apply_rope(k, cos, sin)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # query head h reads kv head h // 2
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attn(x, cos, sin), attn.wo(y.transpose(1, 2).reshape(2, 16, 32)))


def test_rope_score_depends_only_on_relative_position():
    cos, sin = llama.rope_tables(16, 64, 10000.0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)

    def score(i: int, j: int) -> float:
        rq = llama.apply_rope(q.view(1, 1, 1, 16), cos[i:i + 1].double(), sin[i:i + 1].double())
        rk = llama.apply_rope(k.view(1, 1, 1, 16), cos[j:j + 1].double(), sin[j:j + 1].double())
        return float((rq * rk).sum())

    for i, j, shift in ((5, 2, 17), (30, 30, 9), (3, 0, 40)):
        assert score(i, j) == pytest.approx(score(i + shift, j + shift), rel=1e-5, abs=1e-6)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)  # and it does depend on i - j
    rotated = llama.apply_rope(q.view(1, 1, 1, 16), cos[7:8].double(), sin[7:8].double())
    assert float(rotated.norm()) == pytest.approx(float(q.norm()))  # a rotation keeps the norm


def test_tied_and_untied_embeddings_and_flops():
    tied, untied = tiny(), tiny(tie_weights=False)
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.head.weight is not untied.tok_emb.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    assert sum(p.numel() for p in untied.parameters()) == n_tied + 61 * 32
    # the untied model's head is a matmul like the tied one, its embedding table a lookup: same FLOPs
    assert tied.flops_per_token(16) == untied.flops_per_token(16) == 6 * n_tied + 12 * 2 * 32 * 16
    assert "rope_cos" not in tied.state_dict()  # derived from the config, not saved


def test_init_scales_residual_projections_by_depth():
    m = tiny(n_layer=8, n_embd=256, n_head=4, n_kv_head=2, ffn_hidden=512)
    assert m.blocks[0].attn.wq.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for w in (m.blocks[3].attn.wo.weight, m.blocks[3].mlp.w2.weight):
        assert w.std().item() == pytest.approx(0.02 / 4, rel=0.05)  # 1/sqrt(2 * 8) = 1/4


def test_llama3_ffn_rule_and_1b_shapes():
    assert llama.llama3_ffn_hidden(2048, 256, 1.5) == 8192  # Llama-3.2-1B
    assert llama.llama3_ffn_hidden(4096, 1024, 1.3) == 14336  # Llama-3-8B
    cfg = load_config("llama-1b")
    m = torch.device("meta")
    with m:
        model = llama.build(**cfg.model.args)
    assert 1.23e9 < sum(p.numel() for p in model.parameters()) < 1.24e9  # Llama-3.2-1B: 1.236B
    assert model.blocks[0].attn.wk.weight.shape == (512, 2048)


@pytest.mark.parametrize("args, key", [(dict(n_kv_head=3), "n_kv_head"), (dict(n_embd=30), "n_embd"),
                                       (dict(n_embd=12, n_head=4, n_kv_head=4), "even"),
                                       (dict(ffn_hidden=-1), "ffn_hidden"), (dict(rope_theta=0.0), "rope_theta")])
def test_bad_args_refused(args, key):
    with pytest.raises(UserError, match=key):
        llama.build(**{**TINY, **args})


def test_tiny_llama_trains(tmp_path):
    """A stream where each token fixes the next ((t + 7) mod 64): learnable, so the loss must fall well below
    the ln(64) = 4.16 of guessing."""
    import json

    from turbotrain import train
    from turbotrain.data.datasets import TokenWindows

    stream = TokenWindows((torch.arange(256 * 32 + 1) * 7 % 64).to(torch.int32), 32, vocab_size=64)
    cfg = load_config("llama-1b", [*TINY_ARGS, f"run.out_dir={str(tmp_path)!r}", "train.steps=20", "train.lr=1e-2",
                                   "train.warmup_steps=2", "train.log_every=1"])
    train(cfg, train_data=stream)
    rows = [json.loads(line) for line in open(tmp_path / "llama-1b" / "metrics.jsonl")]
    loss = [r["loss"] for r in rows if "loss" in r]
    assert len(loss) == 20 and loss[0] > 3.5, loss
    assert sum(loss[-3:]) / 3 < 2.0, loss  # measured: 4.17 -> 1.56 in 20 steps


def test_fp8_refused_on_cpu(capsys, tmp_path):
    rc = main(["train", "llama-1b", *TINY_ARGS, 'precision.fp8="rowwise"', f"run.out_dir={str(tmp_path)!r}"])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0] == ("error: precision.fp8 = 'rowwise': needs an NVIDIA GPU with FP8 (sm89+, e.g. H100); "
                        "set precision.fp8 = 'off'")


def test_fp8_without_torchao_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # as if not installed: importing it raises ImportError
    monkeypatch.delitem(sys.modules, "torchao.float8", raising=False)
    with pytest.raises(UserError, match=r"precision.fp8 = 'tensorwise': needs torchao .*pip install turbotrain\[fp8\]"):
        require_torchao("tensorwise")


def test_fp8_bad_value_refused():
    with pytest.raises(UserError, match="precision.fp8"):
        load_config("llama-1b", ['precision.fp8="e4m3"'])


NEEDS_TORCHAO = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="needs torchao (pip install turbotrain[fp8])")


class Fp8Net(nn.Module):
    """An embedding, one linear each side of tensorwise's size filter, and a head (tied or not)."""

    def __init__(self, tie: bool = True, vocab: int = 2048):
        super().__init__()
        self.emb = nn.Embedding(vocab, 64)
        self.up = nn.Linear(64, 2048, bias=False)  # N = 2048: large enough for tensorwise, not rowwise
        self.small = nn.Linear(64, 32)
        self.head = nn.Linear(64, vocab, bias=False)
        if tie:
            self.head.weight = self.emb.weight


@NEEDS_TORCHAO
def test_fp8_converts_large_linears_and_keeps_the_head():
    """torchao's size filter per recipe; the head stays a plain Linear, tied or not, unless asked."""
    from turbotrain.accel.fp8 import apply_fp8

    for tie in (True, False):
        net = Fp8Net(tie)
        assert apply_fp8(net, "tensorwise", fsdp=False) == 1
        assert type(net.up).__name__ == "Float8Linear" and type(net.small) is nn.Linear and type(net.head) is nn.Linear
        assert (net.head.weight is net.emb.weight) == tie
    assert apply_fp8(Fp8Net(), "rowwise", fsdp=False) == 0
    sharded = Fp8Net()
    apply_fp8(sharded, "tensorwise", fsdp=True)  # FP8 all-gather: the weight becomes torchao's FSDP2 subclass
    assert type(sharded.up.weight.data).__name__ == "WeightWithDynamicFloat8CastTensor"
    assert apply_fp8(Fp8Net(), "off", fsdp=False) == 0


@NEEDS_TORCHAO
def test_fp8_head_converts_the_head_and_keeps_it_tied():
    from turbotrain.accel.fp8 import apply_fp8

    net = Fp8Net(tie=True, vocab=256)  # 64 -> 256: below the size filter; an explicit ask converts it anyway
    assert apply_fp8(net, "rowwise", fsdp=False, head=True) == 1
    assert type(net.head).__name__ == "Float8Linear" and net.head.weight is net.emb.weight
    # a Llama with its tied head converted: the optimizer still sees each weight once, the tie holds
    m = llama.build(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=32, ffn_hidden=64,
                    tie_weights=True)
    before = [id(p) for p in m.parameters()]
    assert apply_fp8(m, "tensorwise", fsdp=False, head=True) == 1
    assert [id(p) for p in m.parameters()] == before and m.head.weight is m.tok_emb.weight
    # the converted head runs (per-tensor scales: the one FP8 matmul torch's CPU backend takes in every version)
    assert m(torch.randint(0, 64, (2, 16))).shape == (2, 16, 64)


@NEEDS_TORCHAO
@pytest.mark.parametrize("net, fsdp, match", [
    (Fp8Net(vocab=65), False, r"multiples of 16, it is 64 -> 65; pad the vocabulary"),
    (Fp8Net(tie=True), True, r"untie the head from the embedding"),
    (nn.Sequential(nn.Linear(64, 64)), False, r"no output layer"),
])
def test_fp8_head_refusals(net, fsdp, match):
    from turbotrain.accel.fp8 import apply_fp8

    with pytest.raises(UserError, match=r"^precision.fp8_head = true: .*" + match):
        apply_fp8(net, "tensorwise", fsdp=fsdp, head=True)


def test_fp8_head_conflicts_refused_before_the_device(capsys, tmp_path):
    """Config conflicts: said on any machine, before FP8's GPU check. The preset's fused loss is "auto", which
    turns off for the FP8 head: only an explicit true conflicts, and without a conflict the CPU is what is refused."""
    fp8 = ["precision.fp8_head=true", 'precision.fp8="tensorwise"']
    for extra, starts, says in (
            (["precision.fp8_head=true"], "precision.fp8_head = true",
             'but precision.fp8 = "off"; set precision.fp8="tensorwise"'),
            ([*fp8, "kernels.fused_loss=true"], "kernels.fused_loss = true",
             "precision.fp8_head would never run; set kernels.fused_loss=false"),
            (fp8, "precision.fp8", "GPU")):
        rc = main(["train", "llama-1b", *TINY_ARGS, *extra, f"run.out_dir={str(tmp_path)!r}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith(f"error: {starts}") and says in err[-1], err[-1]


def test_llama_8b_preset_builds_on_meta_with_8b_params():
    """The preset's model on the meta device (shapes only, no memory): Llama-3-8B has 8,030,261,248 parameters."""
    cfg = load_config("llama-8b")
    assert cfg.parallel.strategy == "fsdp" and cfg.parallel.fsdp_units == "blocks" and cfg.parallel.meta_init is True
    assert cfg.memory.activation_checkpointing == "selective"
    assert cfg.model.args["block_size"] == cfg.data.args["seq_len"] == 8192
    with torch.device("meta"):
        model = llama.build(**cfg.model.args)
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    assert model.head.weight is not model.tok_emb.weight  # untied
    assert model.blocks[0].attn.wk.weight.shape == (1024, 4096) and model.blocks[0].mlp.w1.weight.shape == (14336, 4096)


SCALED_MM = "Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: (2048x1020)."
SCALED_MM_META = "Expected self.size(1) to be divisible by 16, but got self.size(1)=1020"  # compile's trace


@pytest.mark.parametrize("message, wrapped", [(SCALED_MM, False), (SCALED_MM, True), (SCALED_MM_META, True)])
def test_fp8_rows_not_a_multiple_of_16_is_one_error_naming_the_fix(monkeypatch, message, wrapped):
    """torch._scaled_mm's shape rule on the data's rows (batch x sequence), eager or wrapped by the compiler,
    becomes the UserError at the first step; any other error of the first step is left as it was."""
    from turbotrain import step

    err = RuntimeError(message)
    if wrapped:
        outer = RuntimeError("backend='inductor' raised")
        outer.__cause__ = err
        err = outer

    def fails(exc):
        def train_step(*_a, **_k):
            raise exc
        return train_step

    monkeypatch.setattr(step, "train_step", fails(err))
    got = r"(mat1 shape: \(2048x1020\)|self.size\(1\)=1020)"
    with pytest.raises(UserError, match=rf"multiple of 16 \(torch: got {got}\); .*fp8 = 'off'$"):
        step.first_train_step(None, [], 1.0)
    monkeypatch.setattr(step, "train_step", fails(ValueError("the model's own bug")))
    with pytest.raises(ValueError, match="own bug"):
        step.first_train_step(None, [], 1.0)

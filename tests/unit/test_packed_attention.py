"""kernels.packed_attention on a CPU: the model's qkv_attention is SDPA over the split projection, bit for bit,
wherever the packed op does not run; the resolver turns "auto" off and refuses an explicit true with one line;
the ops have fake implementations (shapes for torch.compile). tests/integration/test_packed_attention_gpu.py
checks the cuDNN op itself against SDPA on a GPU."""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from turbotrain.cli import main
from turbotrain.config import Config, KernelsConfig
from turbotrain.errors import UserError
from turbotrain.models import gpt
from turbotrain.models import packed_attention as pa
from turbotrain.resolve import Facts, _Changes, _packed_attention_blocker, _resolve_packed_attention

TINY = ["model.args.n_layer=1", "model.args.n_head=2", "model.args.n_embd=32", "model.args.vocab_size=64",
        "model.args.block_size=16", "data.args.vocab_size=64", "data.args.seq_len=16", "data.args.size=8",
        "data.batch_size=2", "train.steps=1"]


def _split_sdpa(qkv, n_head, dropout_p=0.0):
    """The GPT block's attention as it was written before qkv_attention: split, view, transpose, SDPA."""
    b, t, c3 = qkv.shape
    d = c3 // 3
    q, k, v = qkv.split(d, dim=2)
    q, k, v = (z.view(b, t, n_head, d // n_head).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    return y.transpose(1, 2).reshape(b, t, d)


@pytest.mark.parametrize("enabled", [False, True])
def test_qkv_attention_is_split_sdpa_exactly(enabled):
    """On a CPU tensor the packed op never runs, also with the setting on: values and gradients are the old code's."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 16, 3 * 32, requires_grad=True)
    dy = torch.randn(2, 16, 32)
    ref = _split_sdpa(qkv, 4)
    (g_ref,) = torch.autograd.grad(ref, qkv, dy)
    with pa.packed_attention(enabled):
        out = pa.qkv_attention(qkv, 4)
    (g,) = torch.autograd.grad(out, qkv, dy)
    assert torch.equal(out, ref) and torch.equal(g, g_ref)
    assert pa._STATE["on"] is False  # the context gives the setting back


def test_packed_attention_context_restores_on_error():
    with pytest.raises(RuntimeError), pa.packed_attention(True):
        assert pa._STATE["on"] is True
        raise RuntimeError("boom")
    assert pa._STATE["on"] is False


def test_gpt_trains_the_same_through_qkv_attention():
    """A GPT's loss with dropout 0 equals the same weights run through the split-SDPA block code."""
    torch.manual_seed(0)
    m = gpt.build(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    idx = torch.randint(0, 64, (2, 16))
    loss = m(idx).logsumexp(-1).mean()

    def old_forward(self, x):
        y = _split_sdpa(self.qkv(self.ln1(x)), self.n_head)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))

    new = gpt.Block.forward
    try:
        gpt.Block.forward = old_forward
        ref = m(idx).logsumexp(-1).mean()
    finally:
        gpt.Block.forward = new
    assert torch.equal(loss, ref)


def test_fake_ops_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        qkv = torch.empty(2, 16, 96, dtype=torch.bfloat16)
        out, st = torch.ops.turbotrain.qkv_attention(qkv, 4)
        dqkv = torch.ops.turbotrain.qkv_attention_backward(out, qkv, out, st, 4)
    assert out.shape == (2, 16, 32) and out.dtype == torch.bfloat16
    assert st.shape == (2, 4, 16, 1) and st.dtype == torch.float32
    assert dqkv.shape == qkv.shape and dqkv.dtype == qkv.dtype


@pytest.fixture(autouse=True)
def _hopper(monkeypatch):
    """Facts of a CUDA device are read on this CPU machine as an sm90 GPU's."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))


def _resolved(setting, device="cpu", qkv=True, attention="default"):
    cfg = Config()
    cfg = type(cfg)(**{**cfg.__dict__, "kernels": KernelsConfig(packed_attention=setting, attention=attention)})
    c = _Changes(cfg)
    _resolve_packed_attention(c, Facts(device=torch.device(device), qkv_attention=qkv))
    return c.cfg.kernels.packed_attention


def test_auto_is_off_where_it_cannot_run():
    assert _resolved("auto") is False
    assert _resolved(False) is False


def test_blockers_name_the_problem():
    cfg = Config()
    cuda = Facts(device=torch.device("cuda"), qkv_attention=True)
    assert "needs a CUDA GPU" in _packed_attention_blocker(cfg, Facts(device=torch.device("cpu"), qkv_attention=True))
    assert "`calls_qkv_attention = True`" in _packed_attention_blocker(cfg, Facts(device=torch.device("cuda")))
    flash = type(cfg)(**{**cfg.__dict__, "kernels": KernelsConfig(attention="flash")})
    assert 'kernels.attention = "flash" disables it' in _packed_attention_blocker(flash, cuda)
    with pytest.raises(UserError, match=r"^kernels.packed_attention = true .*needs a CUDA GPU.*"
                                        r"set kernels.packed_attention=false$"):
        _resolved(True)


def test_missing_frontend_is_named_with_its_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    problem = pa.frontend_problem()
    assert problem.startswith("cudnn-frontend, which does not import here (ModuleNotFoundError")
    assert "pip install 'turbotrain[cudnn]'" in problem
    cfg = Config()
    assert _packed_attention_blocker(cfg, Facts(device=torch.device("cuda"), qkv_attention=True)) == f"needs {problem}"


def test_explicit_true_on_a_cpu_is_one_error_line(capsys, tmp_path):
    rc = main(["train", "gpt2-124m", *TINY, "kernels.packed_attention=true", f"run.out_dir={str(tmp_path)!r}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: kernels.packed_attention = true runs cuDNN's attention kernel"), err
    assert "Traceback" not in "\n".join(err)


def test_dropout_in_the_model_blocks_it():
    """The packed op has no dropout: a model whose attention drops out is told so (auto: off), never run without."""
    m = gpt.build(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32, dropout=0.1)
    from turbotrain.resolve import facts_of

    facts = facts_of(torch.device("cpu"), m, [], {})
    assert facts.qkv_attention and facts.attention_dropout == pytest.approx(0.1)
    cuda = Facts(device=torch.device("cuda"), qkv_attention=True, attention_dropout=0.1)
    assert "attention dropout is 0.1 (model.args.dropout); set it to 0" in _packed_attention_blocker(Config(), cuda)


def test_head_sizes_cudnn_takes():
    assert [d for d in (4, 8, 24, 60, 64, 128, 136, 256) if pa.head_dim_ok(d)] == [8, 24, 64, 128]


def test_precision_without_bf16_or_fp16_blocks_it():
    cfg = Config()
    fp32 = type(cfg)(**{**cfg.__dict__, "precision": type(cfg.precision)(dtype="fp32")})
    cuda = Facts(device=torch.device("cuda"), qkv_attention=True)
    assert 'precision.dtype = "fp32"; set precision.dtype="bf16"' in _packed_attention_blocker(fp32, cuda)


@pytest.mark.parametrize("shape, n_head", [((2, 16, 95), 4), ((2, 16, 96), 5), ((16, 96), 4)])
def test_misshapen_qkv_is_named(shape, n_head):
    with pytest.raises(ValueError, match=r"qkv_attention takes qkv of shape \(B, T, 3C\)"):
        pa.qkv_attention(torch.zeros(shape), n_head)


def test_an_old_gpu_is_refused_before_any_step(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (7, 5))
    cuda = Facts(device=torch.device("cuda"), qkv_attention=True)
    assert "needs an sm80+ GPU (this one is sm75)" in _packed_attention_blocker(Config(), cuda)


def test_a_dropout_module_or_an_odd_value_is_read_not_crashed_on():
    from turbotrain.resolve import _dropout_of

    class Attn(torch.nn.Module):
        calls_qkv_attention = True

        def __init__(self, dropout):
            super().__init__()
            self.dropout = dropout

    assert _dropout_of(Attn(torch.nn.Dropout(0.25))) == 0.25
    assert _dropout_of(Attn(0)) == 0.0 and _dropout_of(Attn(0.1)) == 0.1
    assert _dropout_of(Attn("some")) == 1.0 and _dropout_of(Attn(True)) == 1.0  # unknown: counted as dropout
    assert _dropout_of(torch.nn.Linear(2, 2)) == 0.0


def test_selective_checkpointing_keeps_the_packed_op():
    from turbotrain.accel.activation_ckpt import _SAVE_OPS

    assert torch.ops.turbotrain.qkv_attention.default in _SAVE_OPS

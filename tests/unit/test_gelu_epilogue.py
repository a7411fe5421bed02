"""kernels.gelu_epilogue on a CPU.

- The model's gelu_mlp is `out(gelu(fc(x), tanh))` bit for bit wherever the epilogue ops do not run.
- The ops' index arithmetic (row-major torch tensors handed to column-major cuBLASLt), their autograd formulas
  and their fake implementations (torch.compile, fullgraph) are checked here with cuBLASLt's GEMM replaced by the
  same GEMM + epilogue written in torch: values and all five gradients equal the plain MLP's.
- The resolver turns "auto" off on a CPU and refuses an explicit true with one line.
tests/integration/test_gelu_epilogue_gpu.py checks cuBLASLt itself on a GPU."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from turbotrain.accel.attention import model_ops
from turbotrain.cli import main
from turbotrain.config import KernelsConfig
from turbotrain.models import gelu_epilogue as ge
from turbotrain.models import gpt

TINY = ["model.args.n_layer=1", "model.args.n_head=2", "model.args.n_embd=32", "model.args.vocab_size=64",
        "model.args.block_size=16", "data.args.vocab_size=64", "data.args.seq_len=16", "data.args.size=8",
        "data.batch_size=2", "train.steps=1"]


def _mlp(c=16, h=64, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(c, h).double(), torch.nn.Linear(h, c).double()


def _plain(x, fc, out):
    return out(F.gelu(fc(x), approximate="tanh"))


@pytest.mark.parametrize("enabled", [False, True])
def test_gelu_mlp_is_the_plain_mlp_exactly_on_cpu(enabled):
    fc, out = _mlp()
    fc, out = fc.float(), out.float()
    x = torch.randn(3, 5, 16, requires_grad=True)
    dy = torch.randn(3, 5, 16)
    ref = _plain(x, fc, out)
    g_ref = torch.autograd.grad(ref, (x, fc.weight, out.bias), dy)
    with ge.gelu_epilogue(enabled):
        y = ge.gelu_mlp(x, fc, out)
    g = torch.autograd.grad(y, (x, fc.weight, out.bias), dy)
    assert torch.equal(y, ref) and all(torch.equal(a, b) for a, b in zip(g, g_ref))
    assert ge._STATE["on"] is False


def test_context_gives_the_setting_back_on_error():
    with pytest.raises(RuntimeError), ge.gelu_epilogue(True):
        raise RuntimeError("boom")
    assert ge._STATE["on"] is False


def _emulated_matmul(a, ta, b, tb, m, n, k, out, epilogue, bias=None, aux=None):
    """cuBLASLt's column-major D = op(A) op(B) + epilogue, in torch: a row-major (r, c) tensor is the
    column-major c x r matrix, its transpose."""
    op_a = a.t() if ta == ge._OP_N else a
    op_b = b.t() if tb == ge._OP_N else b
    assert op_a.shape == (m, k) and op_b.shape == (k, n)
    d = op_a @ op_b
    if epilogue == ge._GELU_AUX_BIAS:
        pre = d + bias[:, None]
        aux.copy_(pre.t())
        out.copy_(F.gelu(pre, approximate="tanh").t())
    elif epilogue == ge._DGELU:
        pre = aux.t()
        t = torch.tanh(math.sqrt(2 / math.pi) * (pre + 0.044715 * pre ** 3))
        slope = 0.5 * (1 + t) + 0.5 * pre * (1 - t * t) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * pre ** 2)
        out.copy_((d * slope).t())
    else:
        raise AssertionError(f"unexpected epilogue {epilogue}")
    return True


def _through_ops(x, fc, out):
    g, h = torch.ops.turbotrain.linear_gelu(x, fc.weight, fc.bias)
    return torch.ops.turbotrain.gelu_linear(g, h, out.weight, out.bias)


@pytest.mark.parametrize("compiled", [False, True])
def test_ops_match_the_plain_mlp_in_value_and_every_gradient(monkeypatch, compiled):
    """Shapes where every size differs (N=6, C=16, H=40), fp64: the layouts and autograd formulas are exact."""
    monkeypatch.setattr(ge, "_matmul", _emulated_matmul)
    fc, out = _mlp(16, 40)
    x = torch.randn(6, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(6, 16, dtype=torch.float64)
    params = (x, fc.weight, fc.bias, out.weight, out.bias)
    ref = _plain(x, fc, out)
    g_ref = torch.autograd.grad(ref, params, dy)
    fn = torch.compile(_through_ops, fullgraph=True, backend="aot_eager") if compiled else _through_ops
    y = fn(x, fc, out)
    g = torch.autograd.grad(y, params, dy)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(("x", "fc.weight", "fc.bias", "out.weight", "out.bias"), g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


def test_the_gelu_output_takes_no_gradient_of_its_own(monkeypatch):
    """gelu_linear sends g's gradient through h: asking for g's own gradient is an error, not a silent zero."""
    monkeypatch.setattr(ge, "_matmul", _emulated_matmul)
    fc, out = _mlp(8, 16)
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    g, h = torch.ops.turbotrain.linear_gelu(x, fc.weight, fc.bias)
    assert not g.requires_grad and h.requires_grad


def test_applies_only_to_biased_linears_of_multiples_of_8():
    fc, out = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)
    assert ge._applies(fc, out)
    assert not ge._applies(torch.nn.Linear(16, 64, bias=False), out)
    assert not ge._applies(torch.nn.Linear(12, 60), torch.nn.Linear(60, 12))
    assert not ge._applies(fc, torch.nn.Linear(32, 16))  # fc's outputs are not out's inputs


def test_gpt_blocks_say_they_call_gelu_mlp():
    m = gpt.build(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    assert len(ge.callers(m)) == 2


def test_model_ops_enters_both_switches_as_resolved():
    with model_ops(KernelsConfig(packed_attention=True, gelu_epilogue=True)):
        from turbotrain.models import packed_attention as pa

        assert ge._STATE["on"] is True and pa._STATE["on"] is True
    assert ge._STATE["on"] is False
    with model_ops(KernelsConfig(packed_attention="auto", gelu_epilogue="auto")):  # unresolved: off
        assert ge._STATE["on"] is False


def test_auto_resolves_off_on_a_cpu(tmp_path, capsys):
    assert main(["train", "gpt2-124m", *TINY, f"run.out_dir='{tmp_path}'", "run.name=t"]) == 0
    text = (tmp_path / "t" / "config.toml").read_text()
    assert "gelu_epilogue = false" in text


def test_explicit_true_on_a_cpu_is_one_error_line(tmp_path, capsys):
    assert main(["train", "gpt2-124m", *TINY, f"run.out_dir='{tmp_path}'", "kernels.gelu_epilogue=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: kernels.gelu_epilogue = true runs cuBLASLt's GEMM epilogues, which need a "
                              "CUDA GPU") and err[-1].endswith("set kernels.gelu_epilogue=false")


def test_explicit_true_for_a_model_without_callers_names_the_opt_in(monkeypatch):
    import turbotrain.resolve as resolve
    from turbotrain.config import Config
    from turbotrain.resolve import Facts, _gelu_epilogue_blocker

    monkeypatch.setattr(resolve, "_capability", lambda device: (9, 0))
    why = _gelu_epilogue_blocker(Config(), Facts(device=torch.device("cuda"), gelu_mlp=False))
    assert 'calls_gelu_mlp = ("fc", "out")' in why
    cfg = Config()
    cfg = cfg.__class__(**{**cfg.__dict__, "precision": cfg.precision.__class__(dtype="fp32")})
    why = _gelu_epilogue_blocker(cfg, Facts(device=torch.device("cuda"), gelu_mlp=True, gelu_mlp_applies=True))
    assert 'precision.dtype = "fp32"' in why
    why = _gelu_epilogue_blocker(Config(), Facts(device=torch.device("cuda"), gelu_mlp=True))
    assert "plain nn.Linear layers with biases and sizes of multiples of 8" in why


def test_applies_in_reads_the_named_linears():
    m = gpt.build(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)
    assert ge.applies_in(m)
    odd = gpt.build(vocab_size=64, block_size=16, n_layer=1, n_head=3, n_embd=36)  # 36 and 144: not multiples of 8
    assert ge.callers(odd) and not ge.applies_in(odd)
    nobias = gpt.build(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32, bias=False)
    assert not ge.applies_in(nobias)


def test_a_wrong_input_width_is_torchs_own_shape_error():
    fc, out = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)
    with ge.gelu_epilogue(True), pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        ge.gelu_mlp(torch.randn(4, 8), fc, out)


def test_selective_checkpointing_keeps_both_epilogue_ops():
    from turbotrain.accel import activation_ckpt

    assert set(ge.SAVE_OPS) <= activation_ckpt._SAVE_OPS


def test_applies_only_to_plain_linears():
    """A converted linear (FP8's Float8Linear, a user subclass) runs its own GEMM: the epilogue path must not
    bypass it."""

    class MyLinear(torch.nn.Linear):
        pass

    assert not ge._applies(MyLinear(16, 64), torch.nn.Linear(64, 16))
    assert not ge._applies(torch.nn.Linear(16, 64), MyLinear(64, 16))


def test_views_at_odd_offsets_are_copied_to_an_aligned_buffer():
    base = torch.zeros(1 + 64 * 16, dtype=torch.bfloat16)
    view = base[1:].view(64, 16)  # 2 bytes past an aligned start
    assert view.data_ptr() % 16
    out = ge._aligned(view)
    assert out.data_ptr() % 16 == 0 and torch.equal(out, view)
    fresh = torch.zeros(64, 16, dtype=torch.bfloat16)
    assert ge._aligned(fresh) is fresh


@pytest.mark.parametrize("ckpt, fp8, expected", [("none", "off", True), ("selective", "off", False),
                                                 ("full", "off", True), ("none", "tensorwise", False)])
def test_auto_on_a_hopper_is_off_under_selective_checkpointing_and_fp8(monkeypatch, ckpt, fp8, expected):
    """Selective checkpointing would keep h and gelu(h) (the plain MLP keeps h); FP8 runs the MLP's GEMMs itself."""
    import turbotrain.resolve as resolve
    from turbotrain.config import Config
    from turbotrain.resolve import Facts, _Changes, _resolve_gelu_epilogue

    monkeypatch.setattr(resolve, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(ge, "library_problem", lambda: None)
    cfg = Config()
    cfg = cfg.__class__(**{**cfg.__dict__, "precision": cfg.precision.__class__(dtype="bf16", fp8=fp8),
                           "memory": cfg.memory.__class__(activation_checkpointing=ckpt)})
    c = _Changes(cfg)
    _resolve_gelu_epilogue(c, Facts(device=torch.device("cuda"), gelu_mlp=True, gelu_mlp_applies=True))
    assert c.cfg.kernels.gelu_epilogue is expected


def test_frozen_weights_take_no_gradient_gemms(monkeypatch):
    """Fine-tuning with the MLP frozen: the backward formulas return None for what needs no gradient."""
    monkeypatch.setattr(ge, "_matmul", _emulated_matmul)
    fc, out = _mlp(16, 40)
    for p in (*fc.parameters(), *out.parameters()):
        p.requires_grad_(False)
    x = torch.randn(6, 16, dtype=torch.float64, requires_grad=True)
    y = _through_ops(x, fc, out)
    (dx,) = torch.autograd.grad(y.sum(), x)
    (ref,) = torch.autograd.grad(_plain(x, fc, out).sum(), x)
    torch.testing.assert_close(dx, ref, rtol=1e-12, atol=1e-12)
    assert all(p.grad is None for p in (*fc.parameters(), *out.parameters()))


def test_a_shape_cublaslt_has_no_kernel_for_runs_torchs_math(monkeypatch):
    """No algorithm for a shape (an evaluation batch of another size) is no error mid-run: the ops compute the
    same values in torch."""
    monkeypatch.setattr(ge, "_matmul", lambda *args, **kwargs: False)
    fc, out = _mlp(16, 40)
    x = torch.randn(6, 16, dtype=torch.float64, requires_grad=True)
    params = (x, fc.weight, fc.bias, out.weight, out.bias)
    y = _through_ops(x, fc, out)
    ref = _plain(x, fc, out)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(y.sum(), params), torch.autograd.grad(ref.sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_weights_on_another_device_run_the_plain_mlp(monkeypatch):
    """x on a GPU and the weights elsewhere must be torch's own device error, never host pointers handed to
    cuBLASLt: the check reads the weights' devices (a CPU stands in for the other device here)."""
    fc, out = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)
    x = torch.randn(4, 16, device="meta")  # not CPU, as x.is_cuda would be: the device test must still say no
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t.device.type == "meta"))
    with ge.gelu_epilogue(True), pytest.raises((RuntimeError, NotImplementedError)) as e:
        ge.gelu_mlp(x.to(torch.bfloat16), fc, out)
    assert "turbotrain" not in str(e.value)

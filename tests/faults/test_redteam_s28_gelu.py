"""Red-team cases of kernels.gelu_epilogue's inputs, on a CPU.

- A model's `calls_gelu_mlp` may hold anything. A tensor there ended `turbotrain train` in torch's "Boolean value
  of Tensor ... is ambiguous" traceback (its truth was asked); True, one string or three names were assumed to
  name linears that apply, so an explicit `kernels.gelu_epilogue=true` went through unchecked; a list was read,
  but dotted paths ("mlp.fc", the linears inside a submodule) were not, so a correct opt-in was refused. Now
  a tuple or list of two attribute names or dotted paths names the linears; anything else names none ("auto"
  off, explicit true one `error:` line saying how to name them), and nothing asks an attribute for its truth.
- Linears of size 0 counted as "multiples of 8".
- A batch of 0 or 1 tokens reaching the epilogue ops went to cuBLASLt, which has no GEMM to plan for 0 rows and
  whose heuristic refuses 1-row operands (torch's addmm keeps them off its epilogues): the ops now run the same
  math in torch there. On a CPU any cuBLASLt call fails, so the ops' own code proves the skip.
- A second derivative through the ops (create_graph=True: a gradient penalty, MAML) came out silently wrong
  (gelu(h) takes no gradient of its own); it is now one error naming the setting.
- `bench` listed the gelu_epilogue variant for any caller on any GPU, also where "auto" resolves off (linears
  that do not apply, a GPU older than Hopper): a bf16 rerun labelled as the kernel."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import turbotrain.resolve as resolve
from tests.faults.common import BASE_TOML, lit
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.models import gelu_epilogue as ge
from turbotrain.resolve import Facts, _Changes, _resolve_gelu_epilogue


class Block(nn.Module):
    """A GELU MLP (8 -> 64 -> 8: plain biased linears the epilogues take) and a head to one output; a second such
    pair inside a Sequential gives dotted names something to name."""

    def __init__(self, names):
        super().__init__()
        self.fc, self.out = nn.Linear(8, 64), nn.Linear(64, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 8))
        self.head = nn.Linear(8, 1)
        if names is not _UNSET:
            self.calls_gelu_mlp = names

    def forward(self, x):
        return self.head(ge.gelu_mlp(x, self.fc, self.out)).squeeze(-1)


_UNSET = object()

ODD = [  # calls_gelu_mlp, (a caller, names linears that apply)
    (("fc", "out"), (True, True)),
    (["fc", "out"], (True, True)),
    (("mlp.0", "mlp.1"), (True, True)),
    (True, (True, False)),
    ("fc", (True, False)),
    (("fc", "out", "fc"), (True, False)),
    (("fc", "nope"), (True, False)),
    (("fc", "forward"), (True, False)),  # a method, not a submodule
    ((1, 2), (True, False)),
    (torch.tensor([1, 2]), (True, False)),
    (None, (False, False)),
    (False, (False, False)),
    ((), (False, False)),
    (_UNSET, (False, False)),
]


@pytest.mark.parametrize("names, expected", ODD, ids=[repr(n)[:20] for n, _ in ODD])
def test_odd_calls_gelu_mlp_values_are_read_without_error(names, expected):
    model = nn.Sequential(Block(names))
    assert (bool(ge.callers(model)), ge.applies_in(model)) == expected


def _facts(model) -> Facts:
    return Facts(device=torch.device("cuda"), gelu_mlp=bool(ge.callers(model)),
                 gelu_mlp_applies=ge.applies_in(model))


@pytest.mark.parametrize("names", [True, "fc", ("fc", "out", "fc"), torch.tensor([1, 2])], ids=repr)
def test_explicit_true_on_a_hopper_for_a_caller_naming_no_linears_is_one_line(monkeypatch, names):
    """The GPU and cuBLASLt given (as the unit tests do): the model alone decides."""
    monkeypatch.setattr(resolve, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(ge, "library_problem", lambda: None)
    model = Block(names)
    cfg = load_config(str(BASE_TOML), ["precision.dtype=bf16", "kernels.gelu_epilogue=true"])
    with pytest.raises(UserError) as e:
        _resolve_gelu_epilogue(_Changes(cfg), _facts(model))
    msg = str(e.value)
    assert "\n" not in msg and 'calls_gelu_mlp = ("fc", "out")' in msg and msg.endswith(
        "set kernels.gelu_epilogue=false"), msg
    auto = _Changes(load_config(str(BASE_TOML), ["precision.dtype=bf16"]))
    _resolve_gelu_epilogue(auto, _facts(model))
    assert auto.cfg.kernels.gelu_epilogue is False


def test_dotted_names_opt_in_on_a_hopper(monkeypatch):
    monkeypatch.setattr(resolve, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(ge, "library_problem", lambda: None)
    c = _Changes(load_config(str(BASE_TOML), ["precision.dtype=bf16"]))
    _resolve_gelu_epilogue(c, _facts(Block(("mlp.0", "mlp.1"))))
    assert c.cfg.kernels.gelu_epilogue is True


@pytest.mark.parametrize("setting, error", [("auto", None), ("true", "need a CUDA GPU")])
def test_a_tensor_valued_calls_gelu_mlp_trains_through_the_python_api(tmp_path, setting, error):
    from turbotrain.trainer import train

    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path / 'runs')}", "run.name='r'",
                                       f"kernels.gelu_epilogue={setting}"])
    model = Block(torch.tensor([1, 2]))
    if error is None:
        assert train(cfg, model=model)["steps"] == 4
        assert "gelu_epilogue = false" in (tmp_path / "runs" / "r" / "config.toml").read_text()
    else:
        with pytest.raises(UserError, match=error):
            train(cfg, model=model)


def test_linears_of_size_zero_do_not_apply():
    assert not ge._applies(nn.Linear(0, 64), nn.Linear(64, 8))
    assert not ge._applies(nn.Linear(8, 64), nn.Linear(64, 0))


@pytest.mark.parametrize("tokens", [0, 1])
def test_batches_of_0_and_1_tokens_run_the_ops_without_cublaslt(tokens):
    """The real ops on CPU tensors: a cuBLASLt call would fail here, so equal values and gradients mean the
    torch path ran (fp64: exact up to rounding)."""
    torch.manual_seed(0)
    fc, out = nn.Linear(16, 40).double(), nn.Linear(40, 16).double()
    x = torch.randn(tokens, 16, dtype=torch.float64, requires_grad=True)
    params = (x, fc.weight, fc.bias, out.weight, out.bias)
    ref = out(F.gelu(fc(x), approximate="tanh"))
    dy = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, params, dy)
    g, h = torch.ops.turbotrain.linear_gelu(x, fc.weight, fc.bias)
    y = torch.ops.turbotrain.gelu_linear(g, h, out.weight, out.bias)
    grads = torch.autograd.grad(y, params, dy)
    assert y.shape == (tokens, 16)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("capability, listed", [((9, 0), True), ((8, 0), False)])
def test_bench_lists_the_variant_only_where_auto_turns_it_on(monkeypatch, capability, listed):
    """Linears that apply, on a Hopper: listed; linears of 36 and 144, or an A100: "auto" resolves off there."""
    from turbotrain.bench import default_variants

    monkeypatch.setattr(resolve, "_capability", lambda device: capability)
    monkeypatch.setattr(ge, "library_problem", lambda: None)  # as on a GPU machine, where torch loaded cuBLASLt
    tiny = ["model.args.n_layer=1", "model.args.vocab_size=64", "model.args.block_size=16",
            "data.args.vocab_size=64", "data.args.seq_len=16", "data.args.size=8", "compile.enabled=false"]
    fits = load_config("gpt2-124m", [*tiny, "model.args.n_head=2", "model.args.n_embd=32"])
    odd = load_config("gpt2-124m", [*tiny, "model.args.n_head=3", "model.args.n_embd=36"])  # 36, 144: not x8
    assert ("gelu_epilogue" in default_variants(fits, on_gpu=True)) is listed
    assert "gelu_epilogue" not in default_variants(odd, on_gpu=True)



def _through_ops(x, fc, out):
    g, h = torch.ops.turbotrain.linear_gelu(x, fc.weight, fc.bias)
    return torch.ops.turbotrain.gelu_linear(g, h, out.weight, out.bias)


def _plain(x, fc, out):
    return out(F.gelu(fc(x), approximate="tanh"))


def _weight_penalty_grad(fn, x, fc, out):
    """d/d fc.weight of |d loss / d out.weight|^2: a second derivative, as MAML or a gradient penalty takes."""
    gw, = torch.autograd.grad(fn(x, fc, out).pow(2).sum(), out.weight, create_graph=True)
    return torch.autograd.grad(gw.pow(2).sum(), fc.weight)[0]


def test_double_backward_through_the_ops_is_an_error_not_a_wrong_gradient(monkeypatch):
    """The ops' first-order formulas drop gelu(h)'s dependence on h: a second derivative through them came out
    silently wrong (off by ~90 here). cuBLASLt's GEMM is the unit tests' torch emulation."""
    from tests.unit.test_gelu_epilogue import _emulated_matmul

    monkeypatch.setattr(ge, "_matmul", _emulated_matmul)
    torch.manual_seed(0)
    fc, out = nn.Linear(16, 40).double(), nn.Linear(40, 16).double()
    x = torch.randn(6, 16, dtype=torch.float64, requires_grad=True)
    assert _weight_penalty_grad(_plain, x, fc, out).abs().max() > 1  # a second derivative that matters
    with pytest.raises(UserError, match=r"double backward .*set kernels.gelu_epilogue=false"):
        _weight_penalty_grad(_through_ops, x, fc, out)
    for reentrant in (True, False):  # first order, also where checkpointing runs backward inside backward
        grads = []
        for fn in (_plain, _through_ops):
            x.grad = fc.weight.grad = None
            torch.utils.checkpoint.checkpoint(fn, x, fc, out, use_reentrant=reentrant).pow(2).sum().backward()
            grads.append((x.grad, fc.weight.grad))
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("value", ["auto", "false", None])
def test_the_switch_takes_only_a_resolved_bool(value):
    """bool("false") and bool("auto") are True: a config value handed over unresolved turned the ops on."""
    with pytest.raises(TypeError, match="True or False"), ge.gelu_epilogue(value):
        pass
    assert ge._STATE["on"] is False

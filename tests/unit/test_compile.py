"""Compile wiring: which modules get compiled, state-dict keys kept (training runs: tests/integration)."""
import torch

from turbotrain.accel.compile import CompileConfig, apply_compile, inductor_options
from turbotrain.models.gpt import build as build_gpt


def test_scope_blocks_compiles_each_block_and_keeps_state_dict_keys():
    model = build_gpt(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=16)
    keys = list(model.state_dict())
    targets = apply_compile(model, CompileConfig(enabled=True, scope="blocks", backend="eager"))
    assert targets == list(model.blocks)
    assert list(model.state_dict()) == keys
    assert model(torch.randint(0, 32, (2, 8))).shape == (2, 8, 32)


def test_disabled_compile_is_a_no_op():
    assert apply_compile(torch.nn.Linear(2, 2), CompileConfig(enabled=False)) == []


class _Relu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_inductor_settings_reach_this_compile_and_no_other():
    """inductor's own fault injection (a wrong relu in its CPU code) makes the setting visible in the output."""
    import torch._inductor.config as inductor_config

    torch.manual_seed(0)
    x = torch.randn(8, 4) * 3
    bugged, clean = _Relu(), _Relu()
    clean.load_state_dict(bugged.state_dict())
    want = bugged(x)
    apply_compile(bugged, CompileConfig(enabled=True, inductor={"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}))
    assert not torch.allclose(bugged(x), want)
    assert inductor_config.cpp.inject_relu_bug_TESTING_ONLY is None  # the process's config is untouched
    apply_compile(clean, CompileConfig(enabled=True))
    torch.testing.assert_close(clean(x), want)


def test_inductor_options_are_the_modes_then_ours():
    cfg = CompileConfig(enabled=True, mode="reduce-overhead", coordinate_descent_tuning=True,
                        inductor={"triton.mix_order_reduction": False})
    assert inductor_options(cfg) == {"triton.cudagraphs": True, "coordinate_descent_tuning": True,
                                     "triton.mix_order_reduction": False}
    assert inductor_options(CompileConfig(enabled=True)) == {}

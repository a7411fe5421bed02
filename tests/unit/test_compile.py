"""Compile wiring: which modules get compiled, state-dict keys kept (training runs: tests/integration)."""
import torch

from turbotrain.accel.compile import CompileConfig, apply_compile
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

import pytest
import torch

from tests.helpers import losses, tiny_gpt
from turbotrain.accel.compile import CompileConfig, apply_compile
from turbotrain.models.gpt import build as build_gpt
from turbotrain.errors import UserError
from turbotrain.trainer import parallelize, train


@torch._dynamo.register_backend
def tt_broken_backend(gm, example_inputs):
    raise RuntimeError("planted compiler failure")


def test_compile_failure_falls_back_to_eager_and_says_why(tmp_path, capsys):
    summary = train(tiny_gpt(tmp_path, "compile.enabled=true", "compile.backend=tt_broken_backend", "train.steps=3"))
    assert summary["compile_fell_back"] is True
    out = capsys.readouterr().out
    assert "compile: failed" in out and "planted compiler failure" in out and "falling back to eager" in out
    assert len(losses(tmp_path, "gpt2-124m")) == 3


def test_compiled_training_matches_eager(tmp_path):
    """aot_eager traces through dynamo + autograd without codegen: same numbers, fast on CPU."""
    train(tiny_gpt(tmp_path, "run.name=eager", "train.steps=4"))
    s = train(tiny_gpt(tmp_path, "run.name=compiled", "train.steps=4", "compile.enabled=true", "compile.backend=aot_eager"))
    assert s["compile_fell_back"] is False and s["graph_breaks"] == 0
    assert losses(tmp_path, "eager") == pytest.approx(losses(tmp_path, "compiled"), rel=1e-5)


def test_scope_blocks_compiles_each_block_and_keeps_state_dict_keys():
    model = build_gpt(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=16)
    keys = list(model.state_dict())
    targets = apply_compile(model, CompileConfig(enabled=True, scope="blocks", backend="eager"))
    assert targets == list(model.blocks)
    assert list(model.state_dict()) == keys
    assert model(torch.randint(0, 32, (2, 8))).shape == (2, 8, 32)


def test_disabled_compile_is_a_no_op():
    assert apply_compile(torch.nn.Linear(2, 2), CompileConfig(enabled=False)) == []


def test_compiled_autograd_matches_eager_and_never_falls_back(tmp_path):
    """compile.autograd traces the backward too (captures counted); a compiler failure is an error, not a
    silent fall back (under DDP the Python reducer would then skip the all-reduce)."""
    train(tiny_gpt(tmp_path, "run.name=eager", "train.steps=3"))
    s = train(tiny_gpt(tmp_path, "run.name=ca", "train.steps=3", "compile.enabled=true", "compile.autograd=true",
                       "compile.backend=aot_eager"))
    assert s["compiled_autograd_captures"] >= 1 and s["compile"]["autograd"] is True
    assert losses(tmp_path, "ca") == pytest.approx(losses(tmp_path, "eager"), rel=1e-5)
    with pytest.raises(UserError, match="compile.autograd=true.*planted compiler failure"):
        train(tiny_gpt(tmp_path, "run.name=broken", "compile.enabled=true", "compile.autograd=true",
                       "compile.backend=tt_broken_backend"))


def test_compiled_autograd_is_refused_with_fsdp(tmp_path):
    cfg = tiny_gpt(tmp_path, "compile.enabled=true", "compile.autograd=true")
    with pytest.raises(UserError, match="fsdp"):
        parallelize(build_gpt(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16), None, cfg, "fsdp",
                    torch.device("cpu"), 1, "fp32")

"""torch.compile in training runs: a failing compiler falls back to eager; a compiled run equals eager."""
import pytest
import torch

from tests.helpers import losses, tiny_gpt
from turbotrain.trainer import train


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
    s = train(tiny_gpt(tmp_path, "run.name=compiled", "train.steps=4", "compile.enabled=true",
                       "compile.backend=aot_eager"))
    assert s["compile_fell_back"] is False and s["graph_breaks"] == 0
    assert losses(tmp_path, "eager") == pytest.approx(losses(tmp_path, "compiled"), rel=1e-5)

"""The peer baselines' fairness guard: a run whose optimizer misses a trainable parameter is refused. The case it
exists for: torchao's FP8 conversion with FSDP float8 all-gather on (Accelerate's AORecipeKwargs default, even on
one GPU) swaps each converted weight for a new Parameter, so an optimizer built before it never trains them."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "peer_baselines_common", Path(__file__).resolve().parents[2] / "benchmarks" / "baselines" / "common.py")
common = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = common  # its dataclasses look their module up
_spec.loader.exec_module(common)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))


def _convert(model: torch.nn.Module) -> None:
    float8 = pytest.importorskip("torchao.float8")
    float8.convert_to_float8_training(model, config=float8.Float8LinearConfig(enable_fsdp_float8_all_gather=True))


def test_optimizer_built_before_an_fp8_conversion_is_refused():
    model = _model()
    opt = common.build_optimizer(model, "adamw", 1e-3, 0.1, fused=False)
    _convert(model)
    with pytest.raises(SystemExit, match="does not hold 2 trainable parameters.*0.weight"):
        common.check_optimizer_covers(model, opt)


def test_optimizer_built_after_the_conversion_passes_and_trains_the_fp8_weights():
    model = _model()
    _convert(model)
    opt = common.build_optimizer(model, "adamw", 1e-3, 0.1, fused=False)
    common.check_optimizer_covers(model, opt)
    before = model[0].weight.detach().clone()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    opt.step()
    assert not torch.equal(model[0].weight.detach(), before)


def test_frozen_parameters_are_not_required():
    model = _model()
    model[2].weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    common.check_optimizer_covers(model, opt)

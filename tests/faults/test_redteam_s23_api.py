"""Red-team cases of session 23 on the Python API run several times in one process (a notebook): what one run
sets process-wide is the caller's again after it, warnings said once are said by each run, and objects of the
wrong kind are one UserError each. User code: tests/userpkg/redteam_s23_api.py."""
from __future__ import annotations

import multiprocessing
import random

import numpy as np
import pytest
import torch
from userpkg.models import Linear
from userpkg.redteam_s23_api import FailAtStep2, Hidden, Pairs

import turbotrain
from tests.faults.common import BASE_TOML, lit
from turbotrain.config import load_config
from turbotrain.errors import UserError


def cfg(tmp_path, *overrides: str):
    return load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2", *overrides])


def test_a_warning_said_once_is_said_by_every_run_in_the_process(tmp_path, capsys):
    """log.say_once remembered its messages for the whole process: a notebook's second run with the same problem
    (a warm-up longer than the run) trained without the warning the first run gave."""
    for name in ("first", "second"):
        turbotrain.train(cfg(tmp_path, f"run.name={name!r}", "train.warmup_steps=10"))
        assert "train.warmup_steps=10 > train.steps=2" in capsys.readouterr().out, name


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


@pytest.mark.parametrize("fails", [False, True], ids=["finished", "failed"])
def test_a_run_gives_the_caller_back_their_random_streams_and_tf32(tmp_path, fails):
    """A run seeded the global RNGs (random, numpy, torch) and set TF32 process-wide for its precision, and left
    them so: the notebook's next random draws were the run's, and its float32 matmuls ran in the run's
    precision; a run that failed did the same."""
    model = Linear(8)  # built first: building it draws from the caller's stream
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    expected = _draws()
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    precision, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("medium")  # the caller's choice; the run's fp32 turns TF32 off
    torch.backends.cudnn.allow_tf32 = True
    try:
        if fails:
            with pytest.raises(UserError, match="a bug in the user's callback"):
                turbotrain.train(cfg(tmp_path), model=model, callbacks=[FailAtStep2()])
        else:
            turbotrain.train(cfg(tmp_path, "run.seed=3"), model=model)
        assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == ("medium", True)
        assert _draws() == expected
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn


def test_every_run_in_the_process_compiles_its_model(tmp_path):
    """dynamo kept each run's graphs of the one loss wrapper's forward for the process: at recompile_limit (8 by
    default; 1 here) later runs trained uncompiled, with compile_fell_back false in their summaries."""
    with torch._dynamo.config.patch(recompile_limit=1):
        for width in (4, 5):
            summary = turbotrain.train(cfg(tmp_path, f"run.name='w{width}'", "train.steps=1", "data.eval_batches=0",
                                           "compile.enabled=true", 'compile.backend="eager"'), model=Hidden(width))
            assert summary["unique_graphs"] >= 1 and not summary["compile_fell_back"], (width, summary)


def test_a_failed_run_lets_its_loader_workers_go_while_the_caller_keeps_the_error(tmp_path):
    """The error's traceback holds the run, and a notebook keeps the last error: the loader's worker processes
    (and the optimizer's state) of a run that failed lived on until another error replaced it."""
    before = set(multiprocessing.active_children())
    with pytest.raises(UserError, match="a bug in the user's callback") as kept:
        turbotrain.train(cfg(tmp_path, "data.num_workers=2", "train.steps=3"), callbacks=[FailAtStep2()])
    assert kept.value.__traceback__ is not None
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("kwargs, says", [
    (dict(model=Linear), r"train\(model=\.\.\.\): Linear is a class; pass an instance \(Linear\(\.\.\.\)\)"),
    (dict(train_data=Pairs), r"train\(train_data=\.\.\.\): Pairs is a class; pass an instance"),
    (dict(train_data=Pairs(), val_data=Pairs), r"train\(val_data=\.\.\.\): Pairs is a class; pass an instance"),
    (dict(loss_fn="mse"), r"train\(loss_fn=\.\.\.\): got str 'mse'; pass a function .*train\.loss = \"mse\""),
    (dict(loss_fn=0.5), r"train\(loss_fn=\.\.\.\): got float 0\.5; pass a function fn\(outputs, targets\)"),
    (dict(loss_fn=torch.zeros(4, 4)), r"train\(loss_fn=\.\.\.\): got Tensor tensor\(\[\[0\., 0\., .*; pass a function"),
], ids=["model-class", "train_data-class", "val_data-class", "loss_fn-name", "loss_fn-number", "loss_fn-tensor"])
def test_an_object_of_the_wrong_kind_is_one_error_naming_the_argument(tmp_path, kwargs, says):
    """A class where an instance belongs failed as len() of a type ("fix it there"), or named no fix; a loss
    given by name failed on the first batch as if the loss function had a bug."""
    with pytest.raises(UserError, match=says) as e:
        turbotrain.train(cfg(tmp_path), **kwargs)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "fault").exists()  # refused before the run directory


def test_a_model_trained_in_fp8_is_given_back_with_its_own_linear_layers():
    """precision.fp8 swapped the user's nn.Linear layers for torchao's Float8Linear in place and left them: after
    the run the caller's model computed in FP8, and their next run with precision.fp8 = "off" trained in FP8 too.
    (The run itself needs an FP8 GPU; the swap and the give-back are the trainer's own calls, run here on a CPU.)"""
    pytest.importorskip("torchao.float8")
    from turbotrain.accel.fp8 import apply_fp8
    from turbotrain.pipeline import give_back

    model = torch.nn.Sequential(torch.nn.Linear(64, 2048, bias=False), torch.nn.ReLU(), torch.nn.Linear(2048, 1))
    layers, keys = list(model), list(model.state_dict())
    assert apply_fp8(model, "tensorwise", fsdp=False) == 1
    give_back(model, torch.device("cpu"), channels_last=False)
    assert list(model) == layers and type(model[0]) is torch.nn.Linear and list(model.state_dict()) == keys

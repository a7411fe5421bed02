"""Red-team cases of user code and factories: a sys.exit() in code turbotrain calls without a guard of its own (a
model's forward on the first batch or mid-run, a loss function) ended the CLI with that code and no word, exit 0
reading as a finished run; a data factory without the split parameter, or an optimizer factory without
param_groups, was reported as a problem of the data.args / train.optimizer keywords; a data factory returning its
Dataset class failed as "len() raised TypeError". Each is one `error:` line, exit 2, no traceback. User code:
tests/userpkg/redteam_s26_inputs.py."""
from __future__ import annotations

import pytest

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main

PKG = "userpkg.redteam_s26_inputs"


def _train(tmp_path, *overrides: str) -> int:
    return main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path / 'runs')}", "run.name='r'", *overrides])


@pytest.mark.parametrize("overrides", [
    [f"model.name='{PKG}:exits_in_forward'"],  # on the first batch's contract check
    [f"train.loss='{PKG}:exiting_loss'"],
], ids=["forward", "loss"])
def test_a_sys_exit_in_unguarded_user_code_before_training_is_one_error_line(tmp_path, capsys, overrides):
    assert _train(tmp_path, *overrides) == 2
    line = error_line(capsys.readouterr().err)
    assert "sys.exit(0)" in line and "redteam_s26_inputs.py:" in line, line
    assert "`turbotrain train` did not finish" in line, line
    assert not (tmp_path / "runs" / "r").exists()  # nothing of a run written before its first step


def test_a_sys_exit_in_forward_mid_run_is_one_error_line_and_keeps_the_checkpoints(tmp_path, capsys):
    # the first batch's check is one forward, then training steps': the 6th call is steps past the first checkpoint
    code = _train(tmp_path, f"model.name='{PKG}:exits_in_forward'", "model.args.at=6", "train.steps=10",
                  "checkpoint.every=2")
    assert code == 2
    line = error_line(capsys.readouterr().err)
    assert "sys.exit(0)" in line and "redteam_s26_inputs.py:" in line, line
    ckpts = sorted(p.name for p in (tmp_path / "runs" / "r" / "checkpoints").iterdir())
    assert "step-00000002" in ckpts, ckpts
    assert not (tmp_path / "runs" / "r" / "final").exists()  # an unfinished run has no final model


def test_a_data_factory_without_a_split_parameter_is_said_so(tmp_path, capsys):
    assert _train(tmp_path, f"data.name='{PKG}:no_split'") == 2
    line = error_line(capsys.readouterr().err)
    assert "fn(split, **data.args)" in line and "first parameter for the split" in line, line
    assert "multiple values" not in line  # the old blame on data.args.n


def test_an_optimizer_factory_without_param_groups_is_said_so(tmp_path, capsys):
    assert _train(tmp_path, f"train.optimizer='{PKG}:no_param_groups'") == 2
    line = error_line(capsys.readouterr().err)
    assert "called with 1 positional argument first" in line and "first parameter" in line, line


def test_a_data_factory_returning_its_dataset_class_says_to_return_an_instance(tmp_path, capsys):
    assert _train(tmp_path, f"data.name='{PKG}:returns_class'") == 2
    line = error_line(capsys.readouterr().err)
    assert "returned the class Regression" in line and "Regression(...)" in line, line


@pytest.mark.parametrize("value, said", [
    ("8.0", "model.args.dim = 8.0: userpkg.redteam_s26_inputs:declared() declares dim: int; write 8"),
    ("8.5", "declares dim: int; give a whole number"),
    ("true", "model.args.dim = true: userpkg.redteam_s26_inputs:declared() declares dim: int; give a number"),
    ("'8'", "model.args.dim = '8'"),
])
def test_a_config_value_of_another_kind_than_the_factory_declares_blames_the_config(tmp_path, capsys, value, said):
    # 8.0 failed inside torch ("fix it there", at the user's line); true built a 1-wide layer the data then misfit
    assert _train(tmp_path, f"model.name='{PKG}:declared'", f"model.args.dim={value}") == 2
    assert said in error_line(capsys.readouterr().err)


def test_numbers_of_the_declared_kind_still_build(tmp_path, capsys):
    # an int for a float parameter is a number of that kind: TOML writes scale = 2 as an integer
    assert _train(tmp_path, f"model.name='{PKG}:declared'", "model.args.scale=2", "model.args.dim=8") == 0
    assert (tmp_path / "runs" / "r" / "final").is_dir()

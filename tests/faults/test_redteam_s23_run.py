"""Red-team cases of session 23 on a run's lifecycle and its checkpoints: every save path keeps NaN weights out of
the checkpoints, a second Ctrl-C stops at once. User code: tests/userpkg/redteam_s23_run.py."""
from __future__ import annotations

import json
import os
import signal

import pytest

import turbotrain
from tests.faults.common import BASE_TOML, checkpoint_steps, error_line, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError

R = "userpkg.redteam_s23_run:"


def train_cli(tmp_path, *overrides: str) -> int:
    return main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *overrides])


def test_a_stop_on_nan_weights_keeps_the_last_good_checkpoint_the_one_resumed(tmp_path, capsys):
    """SIGTERM at a step whose weights went NaN: the stop's save wrote them as the newest checkpoint, and every
    rerun resumed the NaN weights and died of them."""
    every = ["checkpoint.every=2", "train.steps=8"]
    assert train_cli(tmp_path, *every, f'train.callbacks=["{R}NanThenTerm"]') == 143
    out = capsys.readouterr().out
    assert "stopped by SIGTERM at step 3" in out and "checkpoint saved" not in out, out
    assert checkpoint_steps(tmp_path / "fault") == [2]
    assert train_cli(tmp_path, *every) == 0, capsys.readouterr().err
    assert "resumed from step 2" in capsys.readouterr().out


def test_a_second_ctrl_c_stops_at_once_without_waiting_for_the_step(tmp_path, capsys):
    """The first Ctrl-C waits for the step to end (then saves); a step that never ends (a hung read) left the user
    no way out but kill -9: the second one now stops at once, with the checkpoints already written kept."""
    assert train_cli(tmp_path, "checkpoint.every=1", f'train.callbacks=["{R}CtrlCTwiceThenStall"]') == 130
    assert error_line(capsys.readouterr().err) == "error: interrupted"
    assert checkpoint_steps(tmp_path / "fault") == [1]  # step 2 was cut short: not saved
    assert train_cli(tmp_path, "checkpoint.every=1") == 0
    assert "resumed from step 1" in capsys.readouterr().out


def test_a_sigterm_in_the_last_step_finishes_the_run_with_final_and_summary(tmp_path, capsys):
    """A stop in the last step saved, exited 143 and asked for a rerun, which found nothing left to train: the
    run had trained every step and never wrote final/ nor summary.json."""
    for every in ("checkpoint.every=2", "checkpoint.every=0"):
        assert train_cli(tmp_path, every, "checkpoint.resume=\"never\"", f'train.callbacks=["{R}TermAtLastStep"]') == 0
        assert "received SIGTERM" in capsys.readouterr().out
        run = tmp_path / "fault"
        assert (run / "summary.json").is_file() and (run / "final").is_dir()
        assert checkpoint_steps(run) == ([2, 4] if every.endswith("2") else [])


def test_a_callback_method_named_like_a_hook_that_is_none_is_refused(tmp_path, capsys):
    """A callback with one real hook and one misspelt or foreign one (on_epoch_end) ran, the second never called."""
    assert train_cli(tmp_path, f'train.callbacks=["{R}MisspeltHook"]') == 2
    line = error_line(capsys.readouterr().err)
    assert "MisspeltHook.on_epoch_end is not a hook" in line and "on_step_end" in line, line
    assert not (tmp_path / "fault").exists()
    from userpkg.redteam_s23_run import MisspeltHook

    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}"])
    with pytest.raises(UserError, match="MisspeltHook.on_epoch_end is not a hook"):
        turbotrain.train(cfg, callbacks=[MisspeltHook()])


def test_an_interrupt_while_final_is_written_leaves_a_run_the_rerun_finishes(tmp_path, capsys, monkeypatch):
    """The end checkpoint was sealed before final/ was written: a Ctrl-C (twice) or a kill in between left a
    finished run without final/ nor summary.json, and the rerun refused it, having nothing left to train."""
    import turbotrain.trainer as trainer

    original = trainer.write_final

    def ctrl_c_twice(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer, "write_final", ctrl_c_twice)
    assert train_cli(tmp_path, "checkpoint.every=2") == 130
    monkeypatch.setattr(trainer, "write_final", original)
    assert train_cli(tmp_path, "checkpoint.every=2") == 0, capsys.readouterr().err
    run = tmp_path / "fault"
    assert (run / "final").is_dir() and json.loads((run / "summary.json").read_text())["steps"] == 4


@pytest.mark.parametrize("value", ["", "  "])
def test_a_blank_resume_path_is_refused_as_blank(tmp_path, capsys, value):
    """checkpoint.resume="" was taken as the current folder: the error named '.', which the user never wrote."""
    assert train_cli(tmp_path, f"checkpoint.resume={value!r}") == 2
    line = error_line(capsys.readouterr().err)
    assert "checkpoint.resume = '" in line and ": expected \"auto\"" in line and "'.'" not in line, line


def test_a_value_returned_by_a_hook_that_logs_nothing_is_said(tmp_path, capsys):
    assert train_cli(tmp_path, f'train.callbacks=["{R}ReturnsFromEvalEnd"]') == 0
    out = capsys.readouterr().out
    assert "ReturnsFromEvalEnd.on_eval_end returned dict; turbotrain ignores what this hook returns" in out, out

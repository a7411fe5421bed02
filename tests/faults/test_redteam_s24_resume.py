"""Red-team cases of session 24 on exact resume: a resumed run continues the uninterrupted run's loss curve
bitwise, whatever the user's code draws from the global RNGs. User code: tests/userpkg/redteam_s24_resume.py."""
from __future__ import annotations

import re

import pytest

from tests.faults.common import BASE_TOML, CrashAt, checkpoint_steps, lit, loss_rows
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.trainer import train

R = "userpkg.redteam_s24_resume:"
STEPS = ["train.steps=6", "checkpoint.every=2"]


def fault_run(out, *overrides: str, callbacks=()) -> dict:
    return train(load_config(str(BASE_TOML), [*STEPS, *overrides, f"run.out_dir={lit(out)}"]),
                 callbacks=list(callbacks))


def crash_then_resume(out, crashed: list[str], resumed: list[str], callbacks=()) -> None:
    with pytest.raises(UserError, match="crash for the test"):
        fault_run(out, *crashed, callbacks=[*callbacks, CrashAt(3)])
    assert fault_run(out, *resumed, callbacks=callbacks)["resumed_from"] == 2


@pytest.mark.parametrize("workers", [(0, 0), (1, 0)], ids=["in-process", "workers-then-in-process"])
def test_random_augmentation_in_the_dataset_resumes_on_the_exact_curve(tmp_path, workers):
    """A dataset drawing noise in __getitem__ from torch's, numpy's and Python's global RNGs: read in the training
    process one batch ahead, its draws moved the stream the checkpoint saved, and the resume drew step 3's
    augmentation from where step 4's had started; in a worker, the worker's stream restarted on the resume.
    Each batch's reads are now seeded by its place: the same with any data.num_workers, and after a resume."""
    data = f"data.name='{R}augmented'"
    fault_run(tmp_path / "whole", data, "data.num_workers=0")
    crashed, resumed = workers
    crash_then_resume(tmp_path / "cut", [data, f"data.num_workers={crashed}"], [data, f"data.num_workers={resumed}"])
    reference = loss_rows(tmp_path / "whole" / "fault")
    assert [s for s, _ in reference] == [1, 2, 3, 4, 5, 6]
    assert loss_rows(tmp_path / "cut" / "fault") == reference


@pytest.mark.parametrize("callback", ["SampleAtCheckpoint", "SampleAtStart"])
def test_a_callback_drawing_random_numbers_leaves_the_resumed_curve_exact(tmp_path, callback):
    """A hook that samples (on_checkpoint after the save, on_train_start after the resume's RNG restore) moved
    the dropout stream in one run and not the other: every step after the resume differed."""
    import userpkg.redteam_s24_resume as user

    model = f"model.name='{R}dropped'"
    fault_run(tmp_path / "whole", model, callbacks=[getattr(user, callback)()])
    crash_then_resume(tmp_path / "cut", [model], [model], callbacks=[getattr(user, callback)()])
    assert loss_rows(tmp_path / "cut" / "fault") == loss_rows(tmp_path / "whole" / "fault")


def test_a_sigterm_to_the_whole_process_group_stops_and_saves_with_loader_workers(tmp_path, capsys):
    """SLURM's scancel and systemd's stop send SIGTERM to every process of the job: the loader workers died of it,
    and the training process, waiting for their batch, ended in "a worker was killed by signal 15 (a crash in
    native code ...)", exit 2, the steps since the last checkpoint lost. Workers ignore it as they do Ctrl-C."""
    run = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f"data.name='{R}group_term'", "data.num_workers=1",
           "data.prefetch_factor=1", "train.steps=8", "checkpoint.every=2"]
    assert main(["train", *run]) == 143, capsys.readouterr().err
    out = capsys.readouterr().out
    stopped = int(re.search(r"stopped by SIGTERM at step (\d+); checkpoint saved", out).group(1))
    assert checkpoint_steps(tmp_path / "fault")[-1] == stopped


def test_a_resume_that_only_evaluates_more_often_keeps_the_loss_curve(tmp_path):
    """train.eval_every changes no math, but the val data's reads (the same augmenting dataset) drew from training's
    RNG at each evaluation: a resume that evaluated more often moved dropout's stream, every later loss differing."""
    both = [f"model.name='{R}dropped'", f"data.name='{R}augmented'"]
    fault_run(tmp_path / "whole", *both)
    crash_then_resume(tmp_path / "cut", both, [*both, "train.eval_every=1"])
    assert loss_rows(tmp_path / "cut" / "fault") == loss_rows(tmp_path / "whole" / "fault")

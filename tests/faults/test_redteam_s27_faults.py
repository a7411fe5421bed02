"""Red-team cases of session 27 on faults during a run (checkpoints, resume, signals, run directories): each failed
before its fix. User code: tests/userpkg/redteam_s27_faults.py."""
from __future__ import annotations

import pytest

from tests.faults.common import BASE_TOML, checkpoint_steps, lit, loss_rows
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.trainer import train

STEPS = ["train.steps=6", "checkpoint.every=4", "train.eval_every=3", "train.schedule='constant'"]


def fault_cfg(out, *overrides: str):
    return load_config(str(BASE_TOML), [*STEPS, *overrides, f"run.out_dir={lit(out)}"])


def eval_oom_model(via: str):
    """The same initial weights every time (the model is built here, outside the run's seeding)."""
    import torch
    from userpkg.redteam_s27_faults import EvalOutOfMemory

    torch.manual_seed(0)
    return EvalOutOfMemory(via=via)


@pytest.mark.parametrize("via", ["numpy", "torch"])
def test_evaluation_out_of_memory_saves_the_steps_trained_and_says_out_of_memory(tmp_path, via):
    """An evaluation that runs out of memory, where the training steps fit, is no fault of the training: as any other
    failure of evaluation it must save the steps trained since the last checkpoint first. A MemoryError (numpy) went
    past that save, losing the 3 steps since step 0 (checkpoint.every = 4); torch's host allocator's RuntimeError
    was saved but told as the model's bug to "fix there", not as memory."""
    with pytest.raises(UserError) as failed:
        train(fault_cfg(tmp_path), model=eval_oom_model(via))
    said = str(failed.value)
    assert isinstance(failed.value, MemoryError)  # a Python caller catching MemoryError still does
    assert "out of memory" in said and "fix it there" not in said and "\n" not in said
    assert "data.batch_size" in said and "step-00000003" in said
    run = tmp_path / "fault"
    assert checkpoint_steps(run) == [3]
    # the rerun without evaluation resumes from the saved step, on the uninterrupted run's curve
    resumed = train(fault_cfg(tmp_path, "data.eval_batches=0"), model=eval_oom_model(via))
    assert resumed["resumed_from"] == 3
    whole = train(fault_cfg(tmp_path / "whole", "data.eval_batches=0"), model=eval_oom_model(via))
    assert whole["steps"] == 6
    assert loss_rows(run) == loss_rows(tmp_path / "whole" / "fault")


def test_evaluation_out_of_memory_from_the_cli_is_one_error_line_after_the_save(tmp_path):
    """The CLI said a MemoryError in evaluation as a host out-of-memory of the whole run (its fixes: activation
    checkpointing, bf16), with the trained steps lost; now one `error:` line naming evaluation, exit 2, and the
    steps saved."""
    from tests.faults.common import run_cli, train_argv

    done = run_cli(train_argv(str(BASE_TOML), *STEPS, "model.name='userpkg.redteam_s27_faults:EvalOutOfMemory'",
                              f"run.out_dir={lit(tmp_path)}"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: evaluation ran out of memory"), done.stderr
    assert "Traceback" not in done.stderr and checkpoint_steps(tmp_path / "fault") == [3]


def _read_at_step_4(out) -> int:
    """An index that the run reads first for its 4th step (the order a run of this config draws)."""
    from userpkg.redteam_s27_faults import BadSampleAt

    class Recorded(BadSampleAt):
        def __getitem__(self, i):
            self.seen.append(int(i))
            return super().__getitem__(i)

    data = Recorded(bad=-1)
    data.seen = []
    train(fault_cfg(out, "train.steps=4", "checkpoint.every=0", "data.eval_batches=0"), train_data=data)
    return next(i for i in data.seen[-8:] if i not in data.seen[:-8])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_training_record_that_fails_to_read_saves_the_steps_trained_before_it(tmp_path, workers):
    """A corrupt record in the training data ends the run with one error line, but the steps trained before its
    batch are good: they were lost back to the last checkpoint (step 0 here, checkpoint.every = 4), where a failed
    evaluation saves them first. Now they are saved, and the rerun on mended data resumes on the whole run's curve."""
    from userpkg.redteam_s27_faults import BadSampleAt

    from tests.faults.common import rows

    bad = _read_at_step_4(tmp_path / "order")
    more = [f"data.num_workers={workers}", "data.eval_batches=0"]
    with pytest.raises(UserError) as failed:
        train(fault_cfg(tmp_path, *more), train_data=BadSampleAt(bad))
    said = str(failed.value)
    assert f"record {bad} is corrupt" in said and "the 3 steps trained are saved in checkpoints/step-00000003" in said
    run = tmp_path / "fault"
    assert checkpoint_steps(run) == [3] and [r["step"] for r in rows(run)] == [1, 2, 3]
    assert train(fault_cfg(tmp_path, *more), train_data=BadSampleAt(-1))["resumed_from"] == 3
    train(fault_cfg(tmp_path / "whole", *more), train_data=BadSampleAt(-1))
    assert loss_rows(run) == loss_rows(tmp_path / "whole" / "fault")

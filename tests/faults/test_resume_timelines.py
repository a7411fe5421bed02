"""Resuming never mixes timelines: a resume from another run's checkpoint sets the run directory's earlier run
aside whole (as a fresh run does); a resume from an earlier step of the same run (a branch, or a fall-back past
a damaged checkpoint) moves the later checkpoints to checkpoints.old-N, so that neither `auto` nor
checkpoint.keep ever picks them over the new ones; a stray step folder that is no checkpoint takes no keep slot."""
from __future__ import annotations

from tests.faults.common import BASE_TOML, checkpoint_steps, ckpt_dir, flip_bytes, lit, resumed_step, rows
from turbotrain.cli import main


def _train(tmp_path, capsys, name, *overrides) -> str:
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f"run.name={name}", *overrides])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def test_resume_from_another_runs_checkpoint_sets_the_earlier_run_aside(tmp_path, capsys):
    _train(tmp_path, capsys, "src", "train.steps=4", "checkpoint.every=2")
    _train(tmp_path, capsys, "mix", "train.steps=6", "checkpoint.every=2", "run.seed=5")
    origin = ckpt_dir(tmp_path / "src", 2)
    out = _train(tmp_path, capsys, "mix", "train.steps=5", "checkpoint.every=1", f"checkpoint.resume={lit(origin)}")
    run = tmp_path / "mix"
    assert resumed_step(out) == 2 and "held an earlier run" in out
    assert checkpoint_steps(run / "previous-1") == [2, 4, 6]  # the earlier run, whole
    assert (run / "previous-1" / "summary.json").exists()
    assert checkpoint_steps(run) == [3, 4, 5] and [r["step"] for r in rows(run)] == [3, 4, 5]
    out = _train(tmp_path, capsys, "mix", "train.steps=7", "checkpoint.every=1")  # auto: this run's own latest
    assert resumed_step(out) == 5


def test_branching_back_moves_the_later_checkpoints_aside(tmp_path, capsys):
    _train(tmp_path, capsys, "br", "train.steps=8", "checkpoint.every=2", "checkpoint.keep=5")
    run = tmp_path / "br"
    out = _train(tmp_path, capsys, "br", "train.steps=8", "checkpoint.every=1", "checkpoint.keep=5",
                 f"checkpoint.resume={lit(ckpt_dir(run, 2))}", "train.lr=0.003")
    assert resumed_step(out) == 2
    assert sorted(p.name for p in (run / "checkpoints.old-1").iterdir()) == [f"step-{s:08d}" for s in (4, 6, 8)]
    assert checkpoint_steps(run) == [4, 5, 6, 7, 8]  # the new branch's; keep=5 pruned step 2 and 3 only
    assert [r["step"] for r in rows(run)] == list(range(1, 9))


def test_falling_back_past_a_damaged_checkpoint_keeps_the_new_ones(tmp_path, capsys):
    _train(tmp_path, capsys, "kp", "train.steps=6", "checkpoint.every=3", "checkpoint.keep=2")
    run = tmp_path / "kp"
    flip_bytes(ckpt_dir(run, 6) / "state.pt")
    out = _train(tmp_path, capsys, "kp", "train.steps=8", "checkpoint.every=2", "checkpoint.keep=1")
    assert resumed_step(out) == 3 and "is corrupt" in out
    assert checkpoint_steps(run) == [8]  # keep=1 kept the newest good one, not the damaged step 6
    assert (run / "checkpoints.old-1" / "step-00000006").is_dir()


def test_a_stray_step_folder_takes_no_keep_slot(tmp_path, capsys):
    _train(tmp_path, capsys, "st", "train.steps=4", "checkpoint.every=2", "checkpoint.keep=2")
    run = tmp_path / "st"
    (run / "checkpoints" / "step-00000001").mkdir()  # empty: no checkpoint
    _train(tmp_path, capsys, "st", "train.steps=8", "checkpoint.every=2", "checkpoint.keep=2")
    assert [s for s in checkpoint_steps(run) if (ckpt_dir(run, s) / "meta.json").exists()] == [6, 8]

"""Red-team cases of session 25 on checkpoints, resume and export under faults: a filesystem that refuses a write
or a move, a process killed mid-save, a branch back that would drop the left timeline's metrics, final/ on a full
disk, and the folder a user names by mistake (a checkpoints folder, final/, a file inside a checkpoint)."""
from __future__ import annotations

import errno
import json
import os

import pytest
import torch

import turbotrain
import turbotrain.checkpoint as checkpoint_mod
import turbotrain.export as export_mod
from tests.faults.common import BASE_TOML, CrashAt, checkpoint_steps, ckpt_dir, error_line, lit, loss_rows, rows
from turbotrain.checkpoint import Checkpointer
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.trainer import train

STEPS = ["train.steps=6", "checkpoint.every=2"]


def _argv(out, *overrides: str) -> list[str]:
    return ["train", str(BASE_TOML), f"run.out_dir={lit(out)}", *STEPS, *overrides]


def _api(out, *overrides: str, callbacks=()) -> dict:
    return train(load_config(str(BASE_TOML), [*STEPS, *overrides, f"run.out_dir={lit(out)}"]),
                 callbacks=list(callbacks))


def _refused(capsys, argv) -> str:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    return error_line(err)


# ---------------------------------------------------------------- a filesystem that refuses writes and moves

@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_checkpoint_write_the_filesystem_refuses_names_a_writable_folder_not_free_space(tmp_path, capsys,
                                                                                        monkeypatch, code):
    """A read-only mount or a folder the user may not write: the line said "free space on that disk ... or lower
    checkpoint.keep", which cures neither."""
    real = torch.save

    def save(obj, f, *a, **k):
        if ".tmp-step-00000004" in str(f):
            raise OSError(code, os.strerror(code), str(f))
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    line = _refused(capsys, _argv(tmp_path))
    assert "a folder you can write" in line and "free" not in line and "checkpoint.keep" not in line, line
    assert checkpoint_steps(tmp_path / "fault") == [2] and Checkpointer.verify(ckpt_dir(tmp_path / "fault", 2)) is None


@pytest.mark.parametrize("move", ["branch", "fresh"])
def test_a_move_aside_the_filesystem_refuses_is_one_error_line_and_keeps_every_file(tmp_path, capsys, monkeypatch,
                                                                                   move):
    """A branch back moves the later checkpoints to checkpoints.old-N, a fresh start the earlier run to previous-N:
    an OSError there (no room for the new folder, a read-only folder) ended in a traceback."""
    assert main(_argv(tmp_path)) == 0
    run, real = tmp_path / "fault", os.replace

    def replace(src, dst, *a, **k):
        if ".old-" in str(dst) or "previous-" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    given = [f"checkpoint.resume={lit(ckpt_dir(run, 2))}"] if move == "branch" else ["checkpoint.resume='never'"]
    line = _refused(capsys, _argv(tmp_path, *given))
    assert "aside" in line and "nothing was deleted" in line and "free space" in line, line
    assert checkpoint_steps(run) == [2, 4, 6] and (run / "final" / "model.safetensors").is_file()


# ---------------------------------------------------------------- a branch back keeps the left timeline's curve

def test_a_branch_back_keeps_the_left_timelines_metrics_beside_its_checkpoints(tmp_path, capsys):
    """The later checkpoints were kept in checkpoints.old-N, but metrics.jsonl was trimmed to the step resumed
    from: the loss curve of steps 3..6 of the timeline left behind was deleted."""
    assert main(_argv(tmp_path)) == 0
    run = tmp_path / "fault"
    before = rows(run)
    capsys.readouterr()
    assert main(_argv(tmp_path, "train.lr=0.003", f"checkpoint.resume={lit(ckpt_dir(run, 2))}")) == 0
    assert "timeline's metrics to checkpoints.old-1.metrics.jsonl" in capsys.readouterr().out
    kept = run / "checkpoints.old-1.metrics.jsonl"
    assert [json.loads(ln) for ln in kept.read_text().splitlines()] == before
    assert sorted(p.name for p in (run / "checkpoints.old-1").iterdir()) == ["step-00000004", "step-00000006"]
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4, 5, 6]


# ---------------------------------------------------------------- a kill mid-save

class Killed(BaseException):
    """The process dying: nothing of turbotrain's handles it (no cleanup runs, as under SIGKILL)."""


def test_a_kill_while_sealing_a_checkpoint_resumes_from_the_one_before_on_the_same_curve(tmp_path, monkeypatch):
    """Killed after step 4's files and meta.json were written, before the rename: the rerun resumes from step 2 on
    the uninterrupted curve, and the temp folder goes at its next save, keep honoured."""
    _api(tmp_path / "whole")
    real = checkpoint_mod._fsync_tree

    def fsync_tree(folder):
        if folder.name == ".tmp-step-00000004":
            raise Killed
        return real(folder)

    monkeypatch.setattr(checkpoint_mod, "_fsync_tree", fsync_tree)
    with pytest.raises(Killed):
        _api(tmp_path / "cut", "checkpoint.keep=2")
    cut = tmp_path / "cut" / "fault"
    assert checkpoint_steps(cut) == [2] and (cut / "checkpoints" / ".tmp-step-00000004" / "meta.json").is_file()
    monkeypatch.setattr(checkpoint_mod, "_fsync_tree", real)
    assert _api(tmp_path / "cut", "checkpoint.keep=2")["resumed_from"] == 2
    assert loss_rows(cut) == loss_rows(tmp_path / "whole" / "fault")
    assert checkpoint_steps(cut) == [4, 6] and not list((cut / "checkpoints").glob(".tmp-*"))


def test_a_kill_between_checkpoints_with_another_every_leaves_no_stale_temp_folder(tmp_path, monkeypatch):
    """A rerun with another checkpoint.every never writes the killed save's step again: its temp folder (a whole
    checkpoint's size) stayed until a later save's prune, taking the room the next save needs on a full disk."""
    real, seen = torch.save, []

    def save(obj, f, *a, **k):
        if ".tmp-step-00000003" in str(f):
            seen.append(sorted(p.name for p in (tmp_path / "fault" / "checkpoints").glob(".tmp-*")))
        return real(obj, f, *a, **k)

    with pytest.raises(UserError, match="crash for the test"):
        _api(tmp_path, callbacks=[CrashAt(3)])
    (tmp_path / "fault" / "checkpoints" / ".tmp-step-00000004").mkdir()  # as a kill mid-write leaves it
    monkeypatch.setattr(torch, "save", save)
    assert _api(tmp_path, "checkpoint.every=3")["resumed_from"] == 2
    assert seen and seen[0] == [".tmp-step-00000003"], seen


# ---------------------------------------------------------------- final/ on a full disk

def _full_at_final(monkeypatch):
    def save_weights(state, tied, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(export_mod, "save_weights", save_weights)


def test_a_full_disk_at_final_without_checkpoints_is_an_error_not_a_done_run(tmp_path, capsys, monkeypatch):
    """With checkpoint.every = 0 (the default) final/ is the only copy of the trained model: its failed write was a
    warning, then "done", exit 0 and summary.json marking the run finished, the model lost."""
    _full_at_final(monkeypatch)
    line = _refused(capsys, _argv(tmp_path, "checkpoint.every=0"))
    assert "final" in line and "No space left" in line and "checkpoint.every" in line, line
    assert not (tmp_path / "fault" / "summary.json").exists() and not (tmp_path / "fault" / "final").exists()


def test_a_full_disk_at_final_with_checkpoints_stays_a_warning(tmp_path, capsys, monkeypatch):
    _full_at_final(monkeypatch)
    capsys.readouterr()
    assert main(_argv(tmp_path)) == 0
    assert "not written (No space left on device); the checkpoints hold the model" in capsys.readouterr().out
    assert checkpoint_steps(tmp_path / "fault") == [2, 4, 6]


def test_a_failed_replace_of_final_keeps_the_earlier_one(tmp_path, capsys, monkeypatch):
    """Extending a finished run rewrites final/: the earlier one was deleted before the new one was renamed in,
    so a failed rename (or a kill between) left the run with no final/ at all."""
    assert main(_argv(tmp_path, "train.steps=4")) == 0
    final, real = tmp_path / "fault" / "final", os.replace
    weights = (final / "model.safetensors").read_bytes()

    def replace(src, dst, *a, **k):
        if str(src).endswith(".tmp") and os.path.basename(dst) == "final":
            raise OSError(errno.EIO, "Input/output error", str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    capsys.readouterr()
    assert main(_argv(tmp_path)) == 0
    assert "not written (Input/output error)" in capsys.readouterr().out
    assert (final / "model.safetensors").read_bytes() == weights
    assert json.loads((final / "final.json").read_text())["step"] == 4
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".final-")]


# ---------------------------------------------------------------- the folder a user names by mistake

@pytest.mark.parametrize("named", ["checkpoints", "final", "checkpoints/step-00000004/state.pt",
                                   "checkpoints/step-00000009", "checkpoints/.tmp-step-00000008"])
def test_resume_from_a_folder_that_is_no_checkpoint_names_the_one_to_use(tmp_path, capsys, named):
    """The example was "RUN/checkpoints/step-00001000" for a run's checkpoints folder, its final/, a file inside
    a checkpoint, a step that does not exist or a temp folder a kill left, though the run's checkpoints lie there."""
    assert main(_argv(tmp_path, "train.steps=4")) == 0
    run = tmp_path / "fault"
    (run / "checkpoints" / ".tmp-step-00000008").mkdir()
    line = _refused(capsys, _argv(tmp_path, "run.name=other", f"checkpoint.resume={lit(run / named)}"))
    want = ckpt_dir(run, 4)
    assert f"{want}" in line and "RUN/checkpoints" not in line, line
    if named == "final":
        assert "no optimizer" in line, line
    assert not (tmp_path / "other" / "checkpoints").exists()


@pytest.mark.parametrize("inside", ["checkpoints/step-00000004", "checkpoints", "final/model.safetensors",
                                    "checkpoints/step-00000004/state.pt"])
def test_load_and_export_of_a_path_inside_a_run_name_the_run(tmp_path, capsys, inside):
    """turbotrain.load(RUN/checkpoints/step-N) said "not a run directory ... e.g. runs/NAME", and a file of the run
    (its final/model.safetensors) "a file, not a run directory": neither named the run to load."""
    assert main(_argv(tmp_path, "train.steps=4")) == 0
    run = tmp_path / "fault"
    with pytest.raises(UserError, match=f"inside the run {run}; name the run"):
        turbotrain.load(run / inside, "cpu")
    assert f"inside the run {run}" in _refused(capsys, ["export", str(run / inside), "--format", "safetensors"])
    assert turbotrain.load(run, "cpu") is not None and not (run / "export").exists()

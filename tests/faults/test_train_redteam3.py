"""Red-team cases of session 21 on `train` itself: a full disk under final/ is safetensors' own error type (an
OSError here, so the run's warning path takes it), a NaN validation loss is JSON null and said, the loader's
sizes have upper bounds, an override cannot smuggle more TOML in after a line break, and the logged lr is the one
the step used."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.faults.common import BASE_TOML, error_line, lit, rows
from turbotrain.cli import main
from turbotrain.export import save_weights


def test_a_failed_safetensors_write_is_an_oserror(tmp_path):
    with pytest.raises(OSError, match="No such file or directory"):
        save_weights({"w": torch.ones(2)}, {}, Path(tmp_path / "missing" / "model.safetensors"))


def test_nan_val_loss_is_null_and_said(tmp_path, capsys):
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", 'model.name="userpkg.redteam2:eval_nan"',
                 "model.args={}"]) == 0
    out = capsys.readouterr().out
    assert "validation loss is nan" in out
    summary = json.loads((tmp_path / "fault" / "summary.json").read_text(),
                         parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert summary["val_loss"] is None and rows(tmp_path / "fault")[-1]["val_loss"] is None


@pytest.mark.parametrize("override, words", [
    ("data.num_workers=100000", ["data.num_workers = 100000", "0-256"]),
    ("data.prefetch_factor=100000000000", ["data.prefetch_factor = 100000000000", "1-256"]),
    ("train.lr=0.5\ntrain.steps=99", ["line break", "one KEY=VALUE per argument"]),
])
def test_config_refusals(tmp_path, capsys, override, words):
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", override]) == 2
    line = error_line(capsys.readouterr().err)
    assert all(w in line for w in words), line


def test_logged_lr_is_the_steps_own(tmp_path, capsys):
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.warmup_steps=2",
                 "train.schedule=\"constant\""]) == 0
    assert [r["lr"] for r in rows(tmp_path / "fault")] == pytest.approx([0.005, 0.01, 0.01, 0.01])


def test_ctrl_c_at_any_moment_of_the_start_is_one_line(tmp_path):
    """While torch is imported a Ctrl-C used to be a traceback, or swallowed by the import (the run then trained
    on to exit 0); from the first step on the run saves and stops as documented."""
    import signal
    import subprocess
    import sys
    import time

    from tests.faults.common import subprocess_env

    for delay in (0.2, 0.5, 1.0, 2.0):
        argv = [sys.executable, "-m", "turbotrain", "train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}",
                "train.steps=100000", f"run.name=sig{delay}"]
        p = subprocess.Popen(argv, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=240)
        assert p.returncode == 130 and "Traceback" not in err, (delay, p.returncode, err[-2000:])
        assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) <= 1, err


def test_a_longer_schedule_on_resume_is_applied_and_said(tmp_path, capsys):
    """Raising train.steps on a cosine run reshapes its schedule: the resumed steps use the new schedule's LR
    at once (as a run of that length from the start), and the resume line says so."""
    base = ["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.warmup_steps=2", "checkpoint.every=3"]
    assert main([*base, "train.steps=6"]) == 0
    capsys.readouterr()
    assert main([*base, "train.steps=12"]) == 0
    assert "applied the new LR schedule" in capsys.readouterr().out
    assert main([*base, "train.steps=12", "run.name=ref"]) == 0
    resumed = {r["step"]: r["lr"] for r in rows(tmp_path / "fault")}
    ref = {r["step"]: r["lr"] for r in rows(tmp_path / "ref")}
    assert [resumed[s] for s in range(7, 13)] == pytest.approx([ref[s] for s in range(7, 13)], rel=1e-12)


def test_a_disk_out_of_inodes_is_said_so(tmp_path, monkeypatch):
    """ENOSPC is the same errno for no bytes and no inodes left: the message tells them apart."""
    import os
    from types import SimpleNamespace

    from turbotrain.files import room_left

    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_bavail=50 * 256, f_frsize=4096, f_files=12,
                                                                 f_favail=0))
    assert room_left(tmp_path / "missing" / "file") == "; 50 MiB free there but no free inodes (too many files)"
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_bavail=0, f_frsize=4096, f_files=12, f_favail=3))
    assert room_left(tmp_path) == "; 0 MiB free there"

"""The run directory is the user's record: one run at a time holds it (a lock a crash does not leave
stuck), no write follows a link out of it, a refused or failed run changes nothing of an earlier run, a fresh
run sets an earlier run aside whole, a resume applies changed hyperparameters deliberately and says so, and
signals during the final save or with DataLoader workers still end in a saved run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.common import (
    BASE_TOML,
    checkpoint_steps,
    ckpt_dir,
    error_line,
    lit,
    report,
    rows,
    subprocess_env,
    wait_for,
)
from tests.helpers import TINY_GPT
from turbotrain.cli import main

BASE = str(BASE_TOML)
GPT = ["gpt2-124m", *TINY_GPT, 'run.device="cpu"', "train.log_every=1", "run.name=gpt"]


pytestmark = pytest.mark.usefixtures("userpkg_importable")


def train(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["train", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory with its bytes (the lock file aside: it only names the holder)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ---------------------------------------------------------------- one run at a time

def test_a_second_run_on_a_held_run_directory_is_refused(tmp_path, capsys):
    from turbotrain.rundir import RunConfig, RunDir

    held = RunDir(RunConfig(name="fault", out_dir=str(tmp_path)), is_main=True).open()
    try:
        rc, out, err = train(capsys, BASE, f"run.out_dir={lit(tmp_path)}")
        assert rc == 2, out + err
        line = error_line(err)
        assert "in use by another run" in line and "run.name" in line
        assert not (tmp_path / "fault" / "metrics.jsonl").exists() and not (tmp_path / "fault" / "config.toml").exists()
    finally:
        held.release()
    rc, out, err = train(capsys, BASE, f"run.out_dir={lit(tmp_path)}")  # released: the directory is free again
    assert rc == 0, err


def test_two_processes_on_one_run_directory_one_is_refused(tmp_path):
    """Two real processes started on the same run directory: exactly one trains, the other is refused
    without touching the first one's files; a killed holder (kill -9) leaves nothing stuck."""
    argv = [sys.executable, "-m", "turbotrain", "train", BASE, f"run.out_dir={lit(tmp_path)}", "train.steps=4000",
            "checkpoint.every=50"]
    first = subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: len(rows(tmp_path / "fault")) >= 3, 120, "the first run logging", first)
        second = subprocess.run(argv, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, report(second)
        assert "in use by another run" in error_line(second.stderr)
        steps = [r["step"] for r in rows(tmp_path / "fault")]
        assert steps == sorted(set(steps)), "duplicate or out-of-order steps: two runs wrote one metrics file"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
    third = subprocess.run([*argv[:-2], "train.steps=5", 'checkpoint.resume="never"'], cwd=tmp_path,
                           env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, report(third)  # the crashed holder's lock went with its process


# ---------------------------------------------------------------- links

@pytest.mark.parametrize("name", ["config.toml", "metrics.jsonl", "summary.json"])
def test_no_write_follows_a_link_out_of_the_run_directory(tmp_path, capsys, name):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    run_dir = tmp_path / "runs" / "fault"
    run_dir.mkdir(parents=True)
    (run_dir / name).symlink_to(outside)
    rc, out, err = train(capsys, BASE, f"run.out_dir={lit(tmp_path / 'runs')}", 'checkpoint.resume="never"')
    assert outside.read_text() == "keep me"
    if rc == 0:  # a fresh run may set the link aside with the earlier run's files instead of writing through it
        assert not (run_dir / name).is_symlink()
    else:
        assert rc == 2 and "symbolic link" in error_line(err)


@pytest.mark.parametrize("name", ["tb", "checkpoints"])
def test_a_linked_folder_in_the_run_directory_is_refused(tmp_path, capsys, name):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run_dir = tmp_path / "runs" / "fault"
    run_dir.mkdir(parents=True)
    (run_dir / name).symlink_to(outside, target_is_directory=True)
    rc, out, err = train(capsys, BASE, f"run.out_dir={lit(tmp_path / 'runs')}", "checkpoint.every=2")
    assert rc == 2, out + err
    assert "symbolic link" in error_line(err)
    assert list(outside.iterdir()) == []


# ---------------------------------------------------------------- earlier runs are never lost

def test_a_refused_resume_changes_nothing_of_the_earlier_run(tmp_path, capsys):
    out_dir = f"run.out_dir={lit(tmp_path)}"
    assert train(capsys, *GPT, out_dir, "train.steps=4", "checkpoint.every=2")[0] == 0
    before = snapshot(tmp_path / "gpt")
    rc, out, err = train(capsys, *GPT, out_dir, "train.steps=6", "model.args.n_embd=48")  # another model
    assert rc == 2 and "another model" in error_line(err)
    assert snapshot(tmp_path / "gpt") == before


def test_rerunning_a_finished_run_says_so_and_changes_nothing(tmp_path, capsys):
    out_dir = f"run.out_dir={lit(tmp_path)}"
    assert train(capsys, *GPT, out_dir, "train.steps=4", "checkpoint.every=2")[0] == 0
    before = snapshot(tmp_path / "gpt")
    rc, out, err = train(capsys, *GPT, out_dir, "train.steps=4", "checkpoint.every=2")
    assert rc == 2, out + err
    line = error_line(err)
    assert "already reached step 4" in line and "train.steps" in line and "run.name" in line
    assert "resumed" not in out
    assert snapshot(tmp_path / "gpt") == before


def test_a_fresh_run_sets_the_earlier_run_aside_whole(tmp_path, capsys):
    out_dir = f"run.out_dir={lit(tmp_path)}"
    assert train(capsys, BASE, out_dir)[0] == 0  # no checkpoints: nothing to resume
    first = snapshot(tmp_path / "fault")
    rc, out, err = train(capsys, BASE, out_dir, "train.steps=3")
    assert rc == 0, err
    assert "moved to" in out and "previous-1" in out
    assert snapshot(tmp_path / "fault" / "previous-1") == first  # the earlier run, byte for byte
    assert [r["step"] for r in rows(tmp_path / "fault") if "loss" in r] == [1, 2, 3]


def test_a_stray_file_where_checkpoints_go_is_set_aside_not_lost(tmp_path, capsys):
    run_dir = tmp_path / "fault"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("not a directory")
    rc, out, err = train(capsys, BASE, f"run.out_dir={lit(tmp_path)}", "checkpoint.every=2")
    assert rc == 0, err
    assert (run_dir / "previous-1" / "checkpoints").read_text() == "not a directory"
    assert checkpoint_steps(run_dir) == [2, 4]


# ---------------------------------------------------------------- resume with other hyperparameters

def test_resume_applies_a_changed_lr_and_says_so(tmp_path, capsys):
    out_dir = f"run.out_dir={lit(tmp_path)}"
    common = [*GPT, out_dir, "train.warmup_steps=0", "train.steps=6"]
    assert train(capsys, *common, "train.lr=0.001", "checkpoint.every=3", "train.steps=3")[0] == 0
    rc, out, err = train(capsys, *common, "train.lr=0.002", "train.weight_decay=0.05")
    assert rc == 0, err
    assert "resumed from step 3" in out and "train.lr (0.001 → 0.002)" in out and "train.weight_decay" in out
    # the LR logged from here on is the new peak on the same schedule: as a run at lr 0.002 from the start
    assert train(capsys, *common, "train.lr=0.002", "run.name=ref")[0] == 0
    resumed = {r["step"]: r["lr"] for r in rows(tmp_path / "gpt")}
    ref = {r["step"]: r["lr"] for r in rows(tmp_path / "ref")}
    assert [resumed[s] for s in (4, 5, 6)] == pytest.approx([ref[s] for s in (4, 5, 6)], rel=1e-12)
    assert json.loads((tmp_path / "gpt" / "summary.json").read_text())["steps"] == 6


# ---------------------------------------------------------------- signals

def test_sigterm_during_the_final_save_still_saves_and_summarizes(tmp_path, capsys, monkeypatch):
    from turbotrain.prepare import Run

    original = Run.save_checkpoint

    def save_with_a_signal(self, step, **kw):
        if step == self.cfg.train.steps:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the final checkpoint is being written
            time.sleep(0.05)
        return original(self, step, **kw)

    monkeypatch.setattr(Run, "save_checkpoint", save_with_a_signal)
    rc, out, err = train(capsys, BASE, f"run.out_dir={lit(tmp_path)}", "checkpoint.every=2")
    assert rc == 0, out + err
    assert checkpoint_steps(tmp_path / "fault")[-1] == 4
    assert json.loads((tmp_path / "fault" / "summary.json").read_text())["steps"] == 4
    assert "SIGTERM during the final save" in out


@pytest.mark.parametrize("trial", [1, 2])
def test_ctrl_c_to_the_process_group_with_loader_workers_saves_cleanly(tmp_path, trial):
    """A terminal's Ctrl-C reaches the training process and its DataLoader workers alike: the run finishes
    its step, saves, exits 130, and no worker prints a traceback."""
    log = tmp_path / "run.log"
    argv = [sys.executable, "-m", "turbotrain", "train", BASE, f"run.out_dir={lit(tmp_path)}", "train.steps=100000",
            "checkpoint.every=1000", "data.num_workers=2", "data.device_resident=false", "data.args.n=4096"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: len(rows(tmp_path / "fault")) >= 5 + 7 * trial, 120, "logged steps", proc)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    text = log.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    stopped = checkpoint_steps(tmp_path / "fault")
    assert stopped
    meta = json.loads((ckpt_dir(tmp_path / "fault", stopped[-1]) / "meta.json").read_text())
    assert meta["step"] == stopped[-1]


def test_a_child_forked_by_a_killed_run_does_not_keep_its_directory_locked(tmp_path):
    """A DataLoader worker is a forked child: were it to share the lock, a run killed with kill -9 (an OOM kill,
    a torchrun restart) would leave its orphaned worker holding the directory and refuse the resume."""
    import textwrap

    from turbotrain.rundir import RunConfig, RunDir

    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from turbotrain.rundir import RunConfig, RunDir
        RunDir(RunConfig(name="fault", out_dir={str(tmp_path)!r}), is_main=True).open()
        child = os.fork()
        if child == 0:  # off the pipes, or the test would wait for it to exit
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 1), os.dup2(null, 2)
            time.sleep(60)
            os._exit(0)
        print(child, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(r.stdout.split()[0])
    try:
        assert r.returncode == -signal.SIGKILL, r.stderr
        os.kill(child, 0)  # the orphan still lives
        RunDir(RunConfig(name="fault", out_dir=str(tmp_path)), is_main=True).open().release()
    finally:
        os.kill(child, signal.SIGKILL)

"""The lead's fixes after session 24's red-team wave: each test failed before its fix."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.helpers import tiny_gpt
from turbotrain import train
from turbotrain.callbacks import Callback


class _SignalInFirstStep(torch.nn.Module):
    """Cross-entropy that sends `signum` to this process in the run's first step (armed by a callback)."""

    def __init__(self, signum: int):
        super().__init__()
        self.signum, self.armed, self.calls = signum, False, 0

    def forward(self, out, y):
        if self.armed:
            self.calls += 1
            os.kill(os.getpid(), self.signum)
        return torch.nn.functional.cross_entropy(out.flatten(0, -2), y.flatten())


class _Arm(Callback):
    def __init__(self, loss):
        self.loss = loss

    def on_train_start(self, state):
        self.loss.armed = True


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, SystemExit), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_before_the_first_step_finishes_stops_at_once(tmp_path, capfd, signum, raised):
    """The first step compiles (minutes for gpt2-124m on a CPU); a signal there waited for it to end."""
    loss = _SignalInFirstStep(signum)
    with pytest.raises(raised) as stopped:
        train(tiny_gpt(tmp_path, "train.steps=4", "checkpoint.every=1", "run.name=s"), loss_fn=loss,
              callbacks=[_Arm(loss)])
    if raised is SystemExit:
        assert stopped.value.code == 128 + signum
    assert loss.calls == 1  # stopped inside the step, not after it
    assert not (tmp_path / "s" / "checkpoints").exists() or not any((tmp_path / "s" / "checkpoints").iterdir())
    assert "before the first step finished: stopping now" in capfd.readouterr().out  # os.write from the handler


def test_user_code_named_in_an_extended_file_is_imported_from_beside_that_file(tmp_path, monkeypatch):
    """tune writes tuned.toml extending the user's file by its absolute path; run from elsewhere, the user's
    package beside the extended file was not importable."""
    import sys

    from turbotrain.cli import main

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    project = tmp_path / "project"
    (project / "s24pkg_extends").mkdir(parents=True)
    (project / "s24pkg_extends" / "__init__.py").write_text("")
    (project / "s24pkg_extends" / "task.py").write_text(
        "import torch\n\ndef build(**kw):\n    return torch.nn.Linear(4, 1)\n\n"
        "def data(split, **kw):\n    g = torch.Generator().manual_seed(0)\n"
        "    return torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))\n")
    (project / "my.toml").write_text('[model]\nname = "s24pkg_extends.task:build"\n[data]\nname = '
                                     '"s24pkg_extends.task:data"\nbatch_size = 8\n[train]\nloss = "mse"\nsteps = 2\n'
                                     'warmup_steps = 0\n[compile]\nenabled = false\n[run]\ndevice = "cpu"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "tuned.toml").write_text(f'extends = {str(project / "my.toml")!r}\n[data]\nbatch_size = 16\n')
    monkeypatch.chdir(elsewhere)
    assert main(["train", str(elsewhere / "tuned.toml"), f"run.out_dir={str(tmp_path / 'runs')!r}"]) == 0
    assert (tmp_path / "runs" / "tuned" / "summary.json").is_file()


def test_a_checkpoint_past_the_file_size_limit_names_the_limit_not_free_space(tmp_path):
    """`ulimit -f` hit while saving said "… MiB free there …: free space", which contradicts itself."""
    import resource

    from turbotrain.errors import UserError

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    cfg = tiny_gpt(tmp_path, "train.steps=2", "checkpoint.every=1", "run.name=f", "data.eval_batches=0")
    resource.setrlimit(resource.RLIMIT_FSIZE, (96 * 1024, hard))  # Python ignores SIGXFSZ: writes get EFBIG
    try:
        with pytest.raises(UserError) as e:
            train(cfg)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert "ulimit -f" in str(e.value) and "free space on that disk" not in str(e.value)


class _CrashAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, state):
        if state.step == self.step:
            raise RuntimeError("crash for the test")


def test_a_resumed_finished_run_that_crashes_no_longer_reads_as_finished(tmp_path):
    """Extending a finished run kept its summary.json: a crash before the new end still read as finished; a
    branch back to an earlier checkpoint also kept the left timeline's final/."""
    from turbotrain.report import load_run, run_state

    over = ["checkpoint.every=2", "data.eval_batches=0", "run.name=r"]
    train(tiny_gpt(tmp_path, "train.steps=4", *over))
    run = tmp_path / "r"
    with pytest.raises(Exception, match="crash for the test"):
        train(tiny_gpt(tmp_path, "train.steps=8", *over), callbacks=[_CrashAt(5)])
    assert not (run / "summary.json").exists() and (run / "summary.step-00000004.json").is_file()
    assert (run / "final").is_dir()  # the model at step 4, which load() refuses now that step 6 is checkpointed
    assert run_state(load_run(run)) != "finished"

    train(tiny_gpt(tmp_path, "train.steps=4", *over, "run.name=b"))
    branch = tmp_path / "b"
    ckpt = branch / "checkpoints" / "step-00000002"
    with pytest.raises(Exception, match="crash for the test"):
        train(tiny_gpt(tmp_path, "train.steps=6", *over, "run.name=b", f"checkpoint.resume={str(ckpt)!r}"),
              callbacks=[_CrashAt(3)])
    assert (branch / "final.step-00000004").is_dir() and not (branch / "final").exists()


def test_tune_says_the_evaluation_and_saves_its_trials_leave_out(tmp_path, capsys):
    from turbotrain.tune import _say_untimed

    _say_untimed(tiny_gpt(tmp_path, "train.eval_every=5", "checkpoint.every=10"), "my.toml")
    out = capsys.readouterr().out
    assert "evaluation every 5 steps and a checkpoint every 10 steps" in out and "turbotrain profile my.toml" in out
    _say_untimed(tiny_gpt(tmp_path, "train.eval_every=0", "checkpoint.every=0"), "my.toml")
    assert capsys.readouterr().out == ""


def test_an_fp16_step_the_scaler_skipped_is_still_checkpointed(tmp_path, capsys):
    """A skipped step's gradient norm is inf by design: its checkpoint was dropped as "non-finite", so a stop there
    saved nothing and a resume went back further."""
    from tests.faults.common import BASE_TOML, lit
    from turbotrain.cli import main

    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "precision.dtype=fp16", "train.steps=3",
                 "checkpoint.every=1"]) == 0  # the fault preset's first 4 steps overflow the default scale
    out = capsys.readouterr().out
    assert "checkpoint skipped" not in out and "skipped" in out  # fp16's own note on its skipped steps
    assert sorted(p.name for p in (tmp_path / "fault" / "checkpoints").iterdir())[-1] == "step-00000003"


def test_report_and_watch_do_not_hang_on_a_fifo_planted_as_summary_json(tmp_path):
    from turbotrain.report import load_run

    train(tiny_gpt(tmp_path, "train.steps=2", "run.name=r", "data.eval_batches=0"))
    (tmp_path / "r" / "summary.json").unlink()
    os.mkfifo(tmp_path / "r" / "summary.json")
    run = load_run(tmp_path / "r")  # blocked forever in open() before
    assert run.summary is None and "summary.json" in run.damaged


def test_a_null_in_the_row_sets_the_prometheus_gauge_to_nan_not_its_old_value():
    import math
    import socket

    pytest.importorskip("prometheus_client")
    from turbotrain.monitor.sinks import Prometheus

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prom = Prometheus(port, "127.0.0.1", rank=0)
    try:
        prom.update({"step": 1, "grad_norm": 2.5})
        prom.update({"step": 2, "grad_norm": None})
        assert math.isnan(prom.gauges["grad_norm"].labels(rank=0)._value.get())
    finally:
        prom.close()


def test_a_model_vocabulary_smaller_than_the_datas_is_refused_at_the_start(tmp_path):
    """Caught only when a batch held an id past it: 31 steps into a text run."""
    from turbotrain.errors import UserError

    with pytest.raises(UserError, match=r"vocab_size = 32 gives the model 32 token ids, fewer than the data's 64"):
        train(tiny_gpt(tmp_path, "model.args.vocab_size=32", "train.steps=2"))
    train(tiny_gpt(tmp_path, "model.args.vocab_size=96", "train.steps=1", "run.name=wider"))  # larger is fine

"""Deferred log rows (one GPU): a log step's values are copied off the device without a sync and its row is built
once the next step is queued. On a CPU the same path runs when `RunMonitor.can_defer` is forced on: the rows, the
stops and the failures must come out as they do with the synchronous row."""
from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from tests.helpers import tiny_gpt
from turbotrain import train
from turbotrain.callbacks import Callback, Hooks
from turbotrain.errors import UserError
from turbotrain.monitor.run_monitor import RunMonitor

KEYS = ("step", "loss", "lr", "grad_norm", "val_loss")


@pytest.fixture
def deferred(monkeypatch):
    monkeypatch.setattr(RunMonitor, "can_defer", property(lambda self: True))


def _rows(tmp_path, name):
    return [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]


def _values(rows):
    return [tuple(r.get(k) for k in KEYS) for r in rows]


def test_deferred_rows_are_the_synchronous_rows(tmp_path, monkeypatch):
    """Eval, checkpoint and the last step interleave with deferred log steps; every row's values are the same."""
    over = ["train.steps=7", "train.log_every=2", "train.eval_every=3", "checkpoint.every=4", "data.eval_batches=1"]
    train(tiny_gpt(tmp_path, *over, "run.name=sync"))
    monkeypatch.setattr(RunMonitor, "can_defer", property(lambda self: True))
    summary = train(tiny_gpt(tmp_path, *over, "run.name=deferred"))
    sync_rows, deferred_rows = _rows(tmp_path, "sync"), _rows(tmp_path, "deferred")
    assert _values(deferred_rows) == _values(sync_rows)
    assert [r["step"] for r in deferred_rows] == [2, 3, 4, 6, 7]
    assert summary["samples_per_s"] > 0 and summary["steps"] == 7


class _Loss(torch.nn.Module):
    """Cross-entropy that counts its calls, raises once `armed` and is NaN once `nan` is set (by a callback)."""

    def __init__(self):
        super().__init__()
        self.calls, self.armed, self.nan = 0, False, False

    def forward(self, out, y):
        self.calls += 1
        if self.armed:
            raise RuntimeError("this step cannot be computed")
        loss = torch.nn.functional.cross_entropy(out.flatten(0, -2), y.flatten())
        return loss * float("nan") if self.nan else loss


class _At(Callback):
    """At the end of step `step`, sets `attr` on the loss: the next step's loss raises or is NaN."""

    def __init__(self, loss: _Loss, step: int, attr: str):
        self.loss, self.step, self.attr = loss, step, attr

    def on_step_end(self, state):
        if state.step == self.step:
            setattr(self.loss, self.attr, True)


def test_a_failure_in_the_step_after_a_deferred_log_step_keeps_that_steps_row(tmp_path, deferred):
    """Step 4 fails after step 3's values were taken without a sync: row 3 is still written."""
    loss = _Loss()
    with pytest.raises(RuntimeError, match="cannot be computed"):
        train(tiny_gpt(tmp_path, "train.steps=8", "run.name=fails"), loss_fn=loss, callbacks=[_At(loss, 3, "armed")])
    assert [r["step"] for r in _rows(tmp_path, "fails")] == [1, 2, 3]


def test_a_nan_loss_stops_the_run_at_its_own_step_when_rows_are_deferred(tmp_path, monkeypatch):
    over = ["train.steps=10", "train.max_bad_steps=1", "checkpoint.every=0"]
    for name in ("sync", "deferred"):
        if name == "deferred":
            monkeypatch.setattr(RunMonitor, "can_defer", property(lambda self: True))
        loss = _Loss()
        with pytest.raises(UserError) as error:
            train(tiny_gpt(tmp_path, *over, f"run.name={name}"), loss_fn=loss, callbacks=[_At(loss, 3, "nan")])
        (sync_error := error) if name == "sync" else (deferred_error := error)
    assert str(deferred_error.value) == str(sync_error.value) and "step 4" in str(sync_error.value)
    assert _values(_rows(tmp_path, "deferred")) == _values(_rows(tmp_path, "sync"))
    assert _rows(tmp_path, "deferred")[-1]["step"] == 4


class _TermAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, state):
        if state.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_at_a_deferred_log_step_writes_its_row_then_saves(tmp_path, deferred):
    with pytest.raises(SystemExit) as stopped:
        train(tiny_gpt(tmp_path, "train.steps=10", "checkpoint.every=5", "run.name=stop"), callbacks=[_TermAt(3)])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert [r["step"] for r in _rows(tmp_path, "stop")] == [1, 2, 3]
    assert (tmp_path / "stop" / "checkpoints" / "step-00000003").is_dir()


class _Reads(Callback):
    """Records how many steps' losses had been computed when each row reached it."""

    def __init__(self, loss):
        self.loss, self.before = loss, 0

    def on_train_start(self, state):
        self.before = self.loss.calls  # the model's checks before the run called the loss too

    def on_log(self, state):
        return {"losses_computed": self.loss.calls - self.before}


class _Counts(Callback):
    def on_step_end(self, state):
        pass


def test_rows_are_built_at_their_step_when_a_callback_reads_them(tmp_path, deferred):
    """An on_log of its own may read the model at that step: no deferral; Callback's own no-op on_log is not one."""
    model = torch.nn.Linear(2, 2)
    assert Hooks([_Reads(None)], 1, model, tmp_path).reads_rows()
    assert not Hooks([_Counts()], 1, model, tmp_path).reads_rows()
    loss = _Loss()
    train(tiny_gpt(tmp_path, "train.steps=4", "run.name=reads", "data.eval_batches=0"), loss_fn=loss,
          callbacks=[_Reads(loss)])
    assert [r["losses_computed"] for r in _rows(tmp_path, "reads")] == [1, 2, 3, 4]


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_on_a_gpu_rows_are_deferred_and_equal_the_synchronous_ones(tmp_path, monkeypatch, compiled):
    """The real path: pinned copy and event on the GPU, CUDA graphs (reduce-overhead) replaying over the loss."""
    over = ["run.device=cuda", "precision.dtype=bf16", "train.steps=8", "train.log_every=1", "train.eval_every=5",
            "checkpoint.every=3", f"compile.enabled={str(compiled).lower()}", "compile.mode=reduce-overhead"]
    monkeypatch.setattr(RunMonitor, "can_defer", property(lambda self: False))
    train(tiny_gpt(tmp_path, *over, "run.name=sync"))
    monkeypatch.undo()
    seen = []
    real = RunMonitor.snapshot
    monkeypatch.setattr(RunMonitor, "snapshot", lambda self, *a, **k: (seen.append(a[0]), real(self, *a, **k)))
    train(tiny_gpt(tmp_path, *over, "run.name=deferred"))
    assert seen == [1, 2, 4, 7]  # not at eval (5), checkpoint (3, 6) or the last step (8)
    a, b = _rows(tmp_path, "sync"), _rows(tmp_path, "deferred")
    assert [(r["step"], r["lr"]) for r in b] == [(r["step"], r["lr"]) for r in a]
    for key in ("loss", "grad_norm"):  # GPU kernels (attention's backward) may sum in another order run to run
        assert [r[key] for r in b] == pytest.approx([r[key] for r in a], rel=1e-2)

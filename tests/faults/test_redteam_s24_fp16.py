"""Red-team cases of session 24 on fp16 loss scaling and the figures of a run. Found: a 2-step fp16 run finished
"done" having applied no optimizer update (GradScaler skipped both overflowing steps, as designed, and nothing
said so), its metrics.jsonl holding `"grad_norm": Infinity` (no JSON); val_acc was made up under mse with integer
targets (a (B, 1) output scored the share of targets equal to 0); a FIFO at alerts.jsonl hung the resume."""
from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from torch import nn

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.distributed.env import DistEnv
from turbotrain.monitor.run_monitor import RunMonitor, StepCost
from turbotrain.trainer import train

pytestmark = pytest.mark.usefixtures("userpkg_importable")

FP16 = ["precision.dtype=fp16", 'monitor.trackers=["jsonl", "csv"]', "checkpoint.every=0"]


def strict_rows(run) -> list[dict]:
    return [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in metrics.jsonl"))
            for line in (run / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- fp16's skipped steps

@pytest.mark.parametrize("steps", [2, 6])
def test_fp16_skipped_steps_are_counted_said_and_null_in_the_rows(tmp_path, capsys, steps):
    """The default scale (2^16) overflows the fault preset's gradients for its first 4 steps: with 2 steps the run
    trained nothing, with 6 it skipped 4 of them. Every row is JSON (a skipped step's norm is null, in the CSV an
    empty cell, never "inf"); the summary counts the skips and the end says so."""
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *FP16, f"train.steps={steps}"]) == 0
    out, run = capsys.readouterr().out, tmp_path / "fault"
    rows = strict_rows(run)
    assert len(rows) == steps and rows[0]["grad_norm"] is None
    assert "inf" not in (run / "metrics.csv").read_text().lower()
    skipped = json.loads((run / "summary.json").read_text())["skipped_steps"]
    if steps == 2:
        assert skipped == 2 and "the run trained nothing: fp16 loss scaling skipped all 2 optimizer steps" in out
    else:
        assert 0 < skipped < steps and f"fp16 loss scaling skipped {skipped} of {steps} optimizer steps" in out
        assert rows[-1]["grad_norm"] is not None  # the scale found: a real norm again


def test_a_run_without_loss_scaling_skips_nothing_and_says_nothing(tmp_path, capsys):
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.steps=2"]) == 0
    assert "skipped" not in capsys.readouterr().out
    assert json.loads((tmp_path / "fault" / "summary.json").read_text())["skipped_steps"] == 0


def test_the_monitor_counts_the_scalers_skips_on_the_device(tmp_path, capsys):
    """A real GradScaler and optimizer: a step with an inf gradient is skipped (the scale halves), a finite one
    is not; the monitor counts one skip in two steps, and the inf norm of the skipped step's row is null."""
    w = nn.Parameter(torch.ones(3))
    opt, scaler = torch.optim.SGD([w], lr=0.1), torch.amp.GradScaler("cpu")
    cost = StepCost(global_batch=8, tokens_per_sample=None, flops_per_sample=1.0, flops_source="test",
                    peak_flops=None)
    monitor = RunMonitor(tmp_path, DistEnv(), torch.device("cpu"), cost, steps=2, start_step=0, max_bad_steps=3,
                         straggler_ratio=0.0, scaler=scaler)
    try:
        for done, factor in [(1, torch.inf), (2, 1.0)]:
            scaler.scale((w * factor).sum()).backward()
            scaler.unscale_(opt)
            norm = torch.linalg.vector_norm(w.grad)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            loss = torch.tensor(1.0)
            monitor.after_step(done, loss)
            row = monitor.measure(done, loss, norm, 0.1, 0.0)
            monitor.write(row, 0.0)
            assert (row["grad_norm"] is None) == (done == 1)
        assert monitor.summary(2, 1.0, False, {})["skipped_steps"] == 1
    finally:
        monitor.close()
    assert "fp16 loss scaling skipped 1 of 2 optimizer steps" in capsys.readouterr().out
    assert [r["grad_norm"] for r in strict_rows(tmp_path)] == [None, pytest.approx(3 ** 0.5)]


# ---------------------------------------------------------------- val_acc only for classes

def _linear_on_int_targets(tmp_path, out_features: int, loss_fn=None, loss: str = "mse") -> dict:
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2", "data.batch_size=8",
                                       "data.eval_batches=1", "checkpoint.every=0", f"train.loss='{loss}'",
                                       'monitor.trackers=["jsonl"]'])
    return train(cfg, model=nn.Linear(4, out_features), train_data=data, val_data=data, loss_fn=loss_fn)


def _user_loss(out, y):
    return nn.functional.mse_loss(out.squeeze(-1), y.float())


@pytest.mark.parametrize("loss_fn", [None, _user_loss], ids=["mse", "user-loss"])
def test_no_val_acc_for_a_regression_output_against_integer_targets(tmp_path, loss_fn):
    """(B, 1) outputs against (B,) integer targets: a value each, not classes; its argmax is always 0."""
    summary = _linear_on_int_targets(tmp_path, 1, loss_fn)
    assert summary["val_loss"] is not None and summary["val_acc"] is None


def test_val_acc_is_kept_for_a_classifier(tmp_path):
    summary = _linear_on_int_targets(tmp_path, 2, loss="cross_entropy")
    assert 0.0 <= summary["val_acc"] <= 1.0


# ---------------------------------------------------------------- run files that are no regular file on resume

def test_a_fifo_at_alerts_jsonl_ends_the_resume_with_one_error_line(tmp_path, capsys):
    """The resume read alerts.jsonl (the rules' memory of the alerts sent) to its end: a FIFO there waited forever
    for a writer. The alarm turns that hang into a failure here."""
    argv = ["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "checkpoint.every=2", 'monitor.trackers=["jsonl"]']
    assert main([*argv, "train.steps=2"]) == 0
    os.mkfifo(tmp_path / "fault" / "alerts.jsonl")
    capsys.readouterr()

    def hung(signum, frame):
        raise TimeoutError("the resume hung on the FIFO at alerts.jsonl")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        assert main([*argv, "train.steps=4"]) == 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    line = error_line(capsys.readouterr().err)
    assert "alerts.jsonl" in line and "not a regular file" in line and "move it aside" in line, line


def test_damaged_bytes_and_an_overlong_field_in_metrics_csv_do_not_stop_the_resume(tmp_path, capsys):
    """metrics.csv is read back on resume (its rows up to the checkpoint): a damaged line (bytes that are no
    UTF-8, a field past the csv module's size limit) was a UnicodeDecodeError or csv.Error traceback."""
    argv = ["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "checkpoint.every=2",
            'monitor.trackers=["jsonl", "csv"]']
    assert main([*argv, "train.steps=2"]) == 0
    with open(tmp_path / "fault" / "metrics.csv", "ab") as f:
        f.write(b"\xff\xfe," + b"x" * 200_000 + b"\n")
    assert main([*argv, "train.steps=4"]) == 0, capsys.readouterr().err
    text = (tmp_path / "fault" / "metrics.csv").read_text()
    assert [line.split(",")[0] for line in text.splitlines()] == ["step", "1", "2", "3", "4"]


# ---------------------------------------------------------------- a tracker factory of the user's

def forgot_return(run_dir, start_step):
    """A tracker factory without its `return`."""


def test_a_tracker_factory_returning_none_is_one_error_line(tmp_path, capsys):
    """build_tracker's None means "an optional sink is unavailable": a factory of the user's returning None was
    dropped in silence, and the run logged nowhere the user asked."""
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.steps=2",
                 f'monitor.trackers=["jsonl", "{__name__}:forgot_return"]']) == 2
    line = error_line(capsys.readouterr().err)
    assert "forgot_return" in line and "returned None, not a tracker" in line, line

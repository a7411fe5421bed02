"""Red team, session 27 (monitoring): faults planted in real runs through the CLI's entry, on fault.toml's linear
regression (tests/userpkg/planted_s27_monitor.py). Found: a healthy full-batch run under warm-up and cosine decay,
whose loss fell 1000x and then bounced up a few-fold at the LR's peak (Adam's overshoot) before it fell again, was
alerted loss_diverging ("lower train.lr"); a loss that never came down from its first value (an LR far too low) was
alerted loss_plateau as "converged (stop, or save the compute)"; a batch holding NaN at a step between log steps
(train.log_every > 1) left NaN weights, and the alert at the next log step blamed the LR."""
from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.faults.common import BASE_TOML, lit
from turbotrain.cli import main
from turbotrain.distributed.env import DistEnv
from turbotrain.monitor.alerts import NonFiniteLoss
from turbotrain.monitor.rules import LossRules, MonitorConfig
from turbotrain.monitor.run_monitor import RunMonitor, StepCost

pytestmark = pytest.mark.usefixtures("userpkg_importable")
# the readings of the machine (data wait, throughput) are left out: these runs are about the loss rules, and a
# loaded machine must not add an alert of its own
QUIET = ("monitor.data_wait_pct=100", "monitor.throughput_drop_ratio=0")


def _train(tmp_path: Path, capsys, *overrides: str) -> tuple[list[dict], str]:
    capsys.readouterr()
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *QUIET, *overrides])
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    path = tmp_path / "fault" / "alerts.jsonl"
    return ([json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []), out


@pytest.mark.parametrize("lr,schedule", [(0.05, "cosine"), (0.02, "constant"), (0.3, "cosine")])
def test_a_converged_loss_bouncing_under_warm_up_and_decay_is_no_divergence(tmp_path, capsys, lr, schedule):
    """Full batch, AdamW: at 0.05 the loss falls from ~7.7 to 0.008 by step 63, overshoots to 0.048 by step 71 (a
    clean rise of 6x over 10 log steps) and falls to 1e-5 after; at the others it bounces 10-30x around 1e-4 or
    1e-6 late in the run, at the level of rounding. Healthy runs: no alert."""
    alerts, out = _train(tmp_path, capsys, "train.steps=300", f"train.lr={lr}", "train.warmup_steps=30",
                         f'train.schedule="{schedule}"', "data.batch_size=64")
    assert alerts == [], alerts
    assert "alert " not in out


def test_a_loss_blowing_up_late_from_a_low_level_is_still_diverging():
    """The floor on the rise is a tenth of the first loss's scale: a real divergence from a converged level (an
    LR far too high late in the run) passes it within a few log steps."""
    rules = LossRules(MonitorConfig(loss_spike_factor=0, loss_plateau_window=0))
    series = [8.0 * 0.9 ** t for t in range(60)] + [0.02 * 1.3 ** t for t in range(40)]
    fired = [i for i, x in enumerate(series) if any(f.rule == "loss_diverging" for f in rules.check(x))]
    assert fired and fired[0] < 60 + 20, fired
    # the same rise relative to its tiny level, that turns back before it reaches that scale, is no divergence
    rules = LossRules(MonitorConfig(loss_spike_factor=0, loss_plateau_window=0))
    bounce = [0.01 + 0.04 * math.sin(math.pi * t / 20) ** 2 for t in range(40)]
    assert not any(rules.check(x) for x in [8.0 * 0.85 ** t for t in range(40)] + bounce)


def test_a_loss_that_never_came_down_is_a_plateau_naming_the_lr_not_convergence(tmp_path, capsys):
    """train.lr = 1e-7: the loss stays at its first value. One plateau, at the window, saying the model is not
    learning and to raise train.lr; "converged" would tell the user to stop a run that never trained."""
    alerts, out = _train(tmp_path, capsys, "train.steps=120", "train.lr=1e-7", "data.batch_size=64")
    assert [(a["rule"], a["step"]) for a in alerts] == [("loss_plateau", 51)], alerts
    message = alerts[0]["message"]
    assert "raise train.lr" in message and "never came down" in message and "converged" not in message, message
    assert "alert loss_plateau at step 51: " in out


def test_a_loss_that_converged_is_still_a_plateau_saying_converged():
    rules = LossRules(MonitorConfig(loss_spike_factor=0, loss_diverging_window=0))
    fired = [f for x in [8.0 * 0.8 ** t + 0.5 for t in range(60)] + [0.5] * 200 for f in rules.check(x)]
    assert [f.rule for f in fired] == ["loss_plateau"], fired
    assert "converged" in fired[0].message and "never came down" not in fired[0].message


@pytest.mark.parametrize("max_bad", [3, 10])  # the stop at the log step, and an alert below it
def test_a_nan_batch_between_log_steps_is_named_as_the_cause_not_the_lr(tmp_path, capsys, max_bad):
    """train.log_every = 4, the batch of step 2 holds NaN inputs: its update leaves NaN weights, the loss is NaN
    from there on, and at log step 4 (a clean batch) the loss_nonfinite alert said "lower train.lr". The batch of
    the step the loss went non-finite at is read again (the loader's read_step) and named."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)) for _ in range(4)]
    batches[1] = (batches[1][0] * torch.nan, batches[1][1])
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cost = StepCost(global_batch=8, tokens_per_sample=None, flops_per_sample=1.0, flops_source="test",
                    peak_flops=None)
    monitor = RunMonitor(tmp_path, DistEnv(), torch.device("cpu"), cost, steps=20, start_step=0,
                         max_bad_steps=max_bad, straggler_ratio=0.0, read_step=lambda i: [batches[i]])
    try:
        for done, (x, y) in enumerate(batches, 1):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.after_step(done, loss.detach())
        with contextlib.suppress(NonFiniteLoss):
            monitor.write(monitor.measure(4, loss.detach(), None, 0.01, 0.0, batch=[batches[3]]), 0.0)
    finally:
        monitor.close()
    alerts = [json.loads(ln) for ln in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [(a["rule"], a["step"]) for a in alerts] == [("loss_nonfinite", 4)], alerts
    message = alerts[0]["message"]
    assert "(since step 2)" in message and "the batch of step 2" in message, message
    assert "NaN/inf in its inputs" in message and "lower train.lr" not in message, message


def test_a_first_loss_logged_after_training_began_gives_no_not_learning_verdict():
    """train.log_every = 50: the first row is step 50's, a model that converged within those steps sits flat
    from there; that is convergence, not "never came down" (the untrained loss was never logged)."""
    rules = LossRules(MonitorConfig(loss_spike_factor=0, loss_diverging_window=0))
    fired = [f for i in range(1, 200) for f in rules.check(0.5 + 1e-4 * (i % 2), step=50 * i)]
    assert [f.rule for f in fired] == ["loss_plateau"], fired
    assert "never came down" not in fired[0].message and "converged" in fired[0].message, fired[0].message
    # logged from step 1, the same flat loss never trained
    rules = LossRules(MonitorConfig(loss_spike_factor=0, loss_diverging_window=0))
    fired = [f for i in range(1, 200) for f in rules.check(0.5 + 1e-4 * (i % 2), step=i)]
    assert [f.rule for f in fired] == ["loss_plateau"] and "never came down" in fired[0].message, fired

"""Red team, session 24, monitoring verdicts. Found: an LR far too high blew the loss up 10^12x at step 2 and left
it there, finite, with no alert at all (the spike rule starts at the 3rd log step and took the new level for the
run's own); one exactly-zero gradient norm left grad_exploding blind for the next 20 log steps; a loss that
crosses zero (a log-likelihood) "spiked" against a running average near 0; a resumed run started its rules afresh
(a dead gradient's alert sent again at once, its baseline re-taken from the dead readings); a NaN validation loss
raised no alert; watch showed the last finite val_loss as the current one after an evaluation logged null."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tests.faults.common import BASE_TOML, lit, rows
from turbotrain.cli import main
from turbotrain.monitor.alerts import Alerts
from turbotrain.monitor.rules import GradRules, LossRules, MonitorConfig

pytestmark = pytest.mark.usefixtures("userpkg_importable")


def train(out: Path, *overrides: str) -> Path:
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(out)}", 'monitor.trackers=["jsonl"]', *overrides]) == 0
    return out / "fault"


def alerts(run: Path) -> list[tuple[int, str]]:
    path = run / "alerts.jsonl"
    got = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    # the timing rules answer the machine's load, not the plant
    return [(a["step"], a["rule"]) for a in got if a["rule"] not in ("throughput_drop", "data_wait")]


# ---------------------------------------------------------------- the rules, on synthetic series

def test_a_loss_blown_up_at_once_and_left_there_is_diverging():
    """lr = 1e6 on the fault preset: 1.79, then 1.8e13, 1.4e12, 1.5e13 ... finite, never NaN, no trend."""
    series = [1.79, 1.8e13, 1.4e12, 1.5e13, 6.4e12, 2.6e12] + [3e12] * 20
    rules = LossRules(MonitorConfig(loss_plateau_window=0))
    got = [(i, f.rule) for i, x in enumerate(series, 1) for f in rules.check(x)]
    assert got and got[0] == (3, "loss_diverging")


def test_a_healthy_noisy_start_is_no_blow_up():
    """Small batches: a loss scattering 15x between batches (the fault preset's 1.5 to 23) is no blow-up."""
    rng = random.Random(3)
    series = [1.5] + [5.0 * rng.lognormvariate(0, 0.6) for _ in range(500)]
    assert [f.rule for x in series for f in LossRules(MonitorConfig(loss_plateau_window=0)).check(x)] == []


def test_a_zero_gradient_norm_does_not_blind_grad_exploding():
    rng = random.Random(4)
    norms = [rng.lognormvariate(0, 0.1) for _ in range(60)]
    norms[40], norms[45] = 0.0, 1e4
    rules = GradRules()
    assert [(i, f.rule) for i, g in enumerate(norms) for f in rules.check(g, 2.0, False)] == [(45, "grad_exploding")]


@pytest.mark.parametrize("mean", [0.0, 0.02])
def test_a_loss_that_crosses_zero_never_spikes(mean):
    """A log-likelihood's loss around 0: any positive loss was "many times" an average near 0."""
    rng = random.Random(5)
    series = [mean + 0.05 * rng.gauss(0, 1) for _ in range(3000)]
    rules = LossRules(MonitorConfig(loss_plateau_window=0))
    assert [f.rule for x in series for f in rules.check(x)] == []


def test_a_spike_on_a_positive_loss_still_fires_after_it_crossed_zero_long_ago():
    rng = random.Random(6)
    series = [0.02 * rng.gauss(0, 1) for _ in range(20)] + [2.0 * rng.lognormvariate(0, 0.05) for _ in range(200)]
    series[180] = 20.0
    rules = LossRules(MonitorConfig(loss_plateau_window=0))
    assert [(i, f.rule) for i, x in enumerate(series) for f in rules.check(x)] == [(180, "loss_spike")]


def test_a_resume_replays_the_rules_and_keeps_the_repeat_limit():
    """What a resumed monitor gets (the rows up to the checkpoint, alerts.jsonl) gives the same verdicts as one
    process: the baseline of the first gradient norms is the run's, and a rule sent 10 s ago is not sent again."""
    rows_ = [{"step": i, "loss": 2.0, "grad_norm": 1.0 if i <= 5 else 1e-5} for i in range(1, 9)]
    clock = [1000.0]
    whole = Alerts(3, MonitorConfig(loss_plateau_window=0), clock=lambda: clock[0])
    for r in rows_ + [{"step": 9, "loss": 2.0, "grad_norm": 1e-5}]:
        whole.check_grad(r["grad_norm"], r["step"], r["loss"])
    assert whole.counts == {"grad_vanishing": 2}  # steps 8 and 9: the 3rd and 4th dead norm in a row
    resumed = Alerts(3, MonitorConfig(loss_plateau_window=0), clock=lambda: clock[0] + 10)
    sent = [{"time": 1000.0, "step": 8, "rank": 0, "rule": "grad_vanishing"}]
    resumed.resume(rows_, sent)
    resumed.check_grad(1e-5, 9, 2.0)
    assert resumed.counts == {"grad_vanishing": 1} and resumed.held == {"grad_vanishing": 1}


# ---------------------------------------------------------------- real tiny runs

def test_an_lr_far_too_high_is_one_loss_diverging(tmp_path):
    run = train(tmp_path, "train.lr=1e6", "train.steps=6")
    losses = [r["loss"] for r in rows(run)]
    assert all(math.isfinite(x) for x in losses) and max(losses[1:]) > 1e6 * losses[0]  # the plant took
    assert alerts(run) == [(3, "loss_diverging")]


def test_a_resumed_run_does_not_send_its_alert_again(tmp_path):
    """A model whose gradient is 0 from step 1: grad_vanishing at step 3, sent once; resumed from step 6 within
    alert_repeat_s it is counted, not sent again (it was: a fresh baseline and a fresh repeat limit)."""
    over = ['model.name="userpkg.redteam_s23_monitor:detached"', "checkpoint.every=3"]
    train(tmp_path, *over, "train.steps=6")
    run = train(tmp_path, *over, "train.steps=12")
    assert rows(run)[-1]["step"] == 12 and alerts(run) == [(3, "grad_vanishing")]
    assert json.loads((run / "summary.json").read_text())["alerts"]["grad_vanishing"] >= 1  # this attempt's


@pytest.fixture(scope="module")
def eval_nan(tmp_path_factory) -> Path:
    """Evaluations at steps 2 and 4, both NaN (logged as null)."""
    return train(tmp_path_factory.mktemp("s24"), 'model.name="userpkg.redteam2:eval_nan"', "model.args={}",
                 "train.eval_every=2", "train.steps=4")


def test_a_nan_validation_loss_is_one_alert(eval_nan):
    assert [r.get("val_loss", 0) for r in rows(eval_nan)] == [0, None, 0, None]
    assert alerts(eval_nan) == [(2, "loss_nonfinite")]  # once: the eval at step 4 is a repeat, counted


def test_watch_does_not_show_an_earlier_val_loss_as_the_current_one(eval_nan, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    lines = (eval_nan / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[1])
    first["val_loss"] = 0.5  # the first evaluation finite, the last null
    (run / "metrics.jsonl").write_text("\n".join([lines[0], json.dumps(first), *lines[2:]]) + "\n")
    assert main(["watch", "--once", str(run)]) == 0
    head = capsys.readouterr().out.splitlines()[1]
    assert "val_loss null" in head and "0.5" not in head

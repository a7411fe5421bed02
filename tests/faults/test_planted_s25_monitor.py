"""Red team, session 25, planted monitoring cases. Found: a throughput dip that recurs with the run's cadence (2
slow log windows after every evaluation or save) fired throughput_drop at every recurrence; a very noisy loss
(small batches, 30-80% scatter between log steps) still falling slowly fired a false loss_plateau early on: its
running average was noisier than loss_plateau_delta, so a lucky batch set the reference the trend then had to beat."""
from __future__ import annotations

import random

import pytest

from turbotrain.monitor.alerts import Alerts, NonFiniteLoss
from turbotrain.monitor.rules import GradRules, LossRules, MonitorConfig, RowRules


def drops(rates: list[float], every: int = 10) -> list[int]:
    rules = RowRules(MonitorConfig())
    return [i for i, x in enumerate(rates) for f in rules.check({"step": every * (i + 1), "samples_per_s": x})
            if f.rule == "throughput_drop"]


@pytest.mark.parametrize("period,slow", [(5, 2), (10, 3), (7, 5)])
def test_a_dip_recurring_with_the_runs_cadence_is_one_drop_not_one_per_recurrence(period, slow):
    rng = random.Random(period)
    rates = [100 * rng.uniform(0.95, 1.05) * (0.4 if i % period >= period - slow else 1) for i in range(20 * period)]
    got = drops(rates)
    # the first two dips alone (nothing to know the rhythm by yet; the rate limit sends one), none after
    assert got and all(i < 2 * period for i in got)
    # a drop that lasts longer than the run's dips is a new episode: still said
    assert drops(rates + [10.0] * (slow + 2))[-1] >= len(rates)


def test_a_drop_that_came_once_does_not_hide_the_next_one():
    rates = [100.0] * 40 + [30.0] * 6 + [100.0] * 20 + [30.0] * 3
    assert drops(rates) == [41, 42, 43, 44, 45, 67, 68]  # the second drop at its 2nd slow window, as the first


def plateaus(f, sigma: float, n: int, seed: int) -> list[int]:
    rng, rules = random.Random(seed), LossRules(MonitorConfig())
    return [t for t in range(1, n + 1) for a in rules.check(f(t) * rng.lognormvariate(0, sigma))
            if a.rule == "loss_plateau"]


@pytest.mark.parametrize("seed", [7, 8, 13])
def test_a_very_noisy_loss_still_falling_is_no_early_plateau(seed):
    assert plateaus(lambda t: 2.0 * t ** -0.1 + 0.5, 0.5, 700, seed) == []


def test_a_very_noisy_dead_loss_is_still_one_plateau():
    got = plateaus(lambda t: 2.3, 0.5, 5000, 0)
    assert len(got) == 1


def loss_alerts(series: list[float]) -> list[tuple[int, str]]:
    rules = LossRules(MonitorConfig())
    return [(i, f.rule) for i, x in enumerate(series, 1) for f in rules.check(x)]


@pytest.mark.parametrize("seed", range(3))
def test_a_loss_that_jumps_to_a_new_phase_and_falls_from_there_is_no_plateau(seed):
    """Harder data (a curriculum), unfrozen layers: the loss jumps 1.5x and falls from its new level. The plateau
    rule measured that fall against the best of the easier phase and called it a stall ~70 log steps on."""
    rng = random.Random(seed)
    assert loss_alerts([2 * t ** -0.1 * (1.5 if t >= 200 else 1) * rng.lognormvariate(0, 0.02)
                        for t in range(1, 1500)]) == []


def test_a_loss_rising_slowly_is_diverging_not_a_plateau():
    rng = random.Random(1)
    got = {r for _, r in loss_alerts([2 * 1.005 ** t * rng.lognormvariate(0, 0.02) for t in range(300)])}
    assert got == {"loss_diverging"}


def test_a_gradient_norm_growing_a_little_every_log_step_is_grad_exploding():
    """1.2x a log step: every norm is 6x the median of the last 20, never the 10x that rule asks; 10^30x its start."""
    rules = GradRules()
    norms = [1.0] * 100 + [1.2 ** k for k in range(1, 300)]
    got = [i for i, g in enumerate(norms) for f in rules.check(g, 2.0, False) if f.rule == "grad_exploding"]
    assert got and got[0] < 150 and "its first readings" in rules.check(norms[-1] * 1.2, 2.0, False)[0].message


@pytest.mark.parametrize("norms", [[0.1 * min(t, 50) for t in range(1, 400)],  # warm-up: 16x its start
                                   [10 * t ** -0.5 for t in range(1, 400)]])
def test_healthy_gradient_norms_are_no_explosion(norms):
    rules = GradRules()
    assert [f.rule for g in norms for f in rules.check(g, 2.0, False)] == []


def test_the_non_finite_stop_names_the_step_the_loss_went_non_finite_at():
    alerts = Alerts(3, MonitorConfig())
    with pytest.raises(NonFiniteLoss, match=r"at step 9, non-finite for 3 step\(s\) \(since step 7\)"):
        alerts.check_loss(float("nan"), 9, 3.0, final=False)

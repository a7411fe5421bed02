"""Red team, session 24, the alert rules on long and patterned runs. Found: loss_plateau fired about every 50 log
steps on a healthy power-law loss once the run was long (180 firings in 10^4 log steps of 4 t^-0.1: it asked
for 1% in 50 log steps, while a healthy loss needs a stretch that grows with its age), and once per window
forever on a stuck one; a loader that stalled every other log window (85% / 0% / 85%) never raised data_wait,
nor a GPU starved in a pattern gpu_util_low: each needed N log windows in a row."""
from __future__ import annotations

import math
import random

import pytest

from turbotrain.monitor.rules import LossRules, MonitorConfig, RowRules

N = 10_000  # log steps: a long run


def loss_alerts(series: list[float], rules: LossRules | None = None) -> list[tuple[int, str]]:
    rules = rules or LossRules(MonitorConfig())
    return [(i, f.rule) for i, x in enumerate(series, 1) for f in rules.check(x)]


def noisy(f, sigma: float, n: int = N, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [f(t) * rng.lognormvariate(0, sigma) for t in range(1, n + 1)]


def cosine(t: int) -> float:
    """A loss that falls faster as a cosine LR schedule anneals to 0 at the end."""
    return 1.5 + 2 * math.exp(-t / 1500) - 0.3 * (1 - 0.5 * (1 + math.cos(math.pi * t / N)))


HEALTHY = {
    "power law": (lambda t: 4 * t ** -0.1, 0.0),
    "noisy power law": (lambda t: 4 * t ** -0.1, 0.05),
    "slow power law to a floor": (lambda t: 1.7 + 4 * t ** -0.3, 0.02),
    "exponential decay to a floor": (lambda t: 1 + 3 * math.exp(-t / 2000), 0.02),
    "warm-up": (lambda t: 4 * (1 - 0.3 * min(t, 100) ** 2 / 100 ** 2) if t <= 100 else 2.8 * (t / 100) ** -0.1, 0.02),
    "cosine schedule": (cosine, 0.02),
    "step-decay LR drops": (lambda t: 3 * t ** -0.1 * (0.8 if t > 5000 else 1) * (0.8 if t > 8000 else 1), 0.02),
}


@pytest.mark.parametrize("name", HEALTHY)
def test_a_long_healthy_run_raises_no_loss_alert(name):
    f, sigma = HEALTHY[name]
    assert loss_alerts(noisy(f, sigma)) == []


def test_a_dead_model_is_one_plateau_at_its_window_however_long():
    assert loss_alerts([2.3] * N) == [(51, "loss_plateau")]
    for seed in range(3):  # small batches: a noisy loss, whose dips are no training
        got = loss_alerts(noisy(lambda t: 2.3, 0.1, seed=seed))
        assert [r for _, r in got] == ["loss_plateau"] and got[0][0] <= 200


def test_a_loss_that_stops_is_one_plateau_soon_and_another_after_it_trains_again():
    stuck = 4 * 300 ** -0.1
    series = ([4 * min(t, 300) ** -0.1 for t in range(1, 601)]  # trains, then stuck from log step ~300
              + [stuck * 0.98 ** t for t in range(1, 31)] + [stuck * 0.98 ** 30] * 3000)  # trains again, stuck again
    got = loss_alerts(series)
    assert [r for _, r in got] == ["loss_plateau", "loss_plateau"]
    # the second within 4x the first stall (~300 log steps): what the run showed of its own pace
    assert 300 < got[0][0] <= 450 and 630 < got[1][0] <= 630 + 4 * 330
    # stuck after a long healthy stretch: seen within a fraction of the run's age, not after another 10^4
    got = loss_alerts([4 * min(t, 3000) ** -0.1 for t in range(1, 6001)])
    assert [r for _, r in got] == ["loss_plateau"] and 3000 < got[0][0] <= 4200


def test_a_zero_plateau_delta_is_no_crash():
    got = loss_alerts(noisy(lambda t: 2.0, 0.1, n=1000), LossRules(MonitorConfig(loss_plateau_delta=0)))
    assert [r for _, r in got] == ["loss_plateau"]  # any improvement is progress: the noise's, for a while


def test_a_resumed_long_run_counts_the_log_steps_its_replay_left_out():
    """Alerts.resume replays the first and the last 1000 rows of a long run: the rules must still know its age."""
    def resumed(series: list[float]) -> LossRules:
        rules = LossRules(MonitorConfig())
        for x in series[:1000]:
            rules.check(x)
        rules.skipped(N - 4000)
        for x in series[N - 3000:N - 2000]:
            rules.check(x)
        return rules

    series = noisy(lambda t: 4 * t ** -0.1, 0.02, seed=2)
    assert loss_alerts(series[N - 2000:], resumed(series)) == []  # the run goes on after the restart: healthy
    stuck = series[:N - 2000] + [series[N - 2001]] * 2000  # stuck from the restart on: still seen
    assert [r for _, r in loss_alerts(stuck[N - 2000:], resumed(stuck))] == ["loss_plateau"]


# ---------------------------------------------------------------- data wait and GPU utilisation

def rows(waits: list[float], compute_ms: float = 100.0, every: int = 10) -> list[dict]:
    """Log rows of a loader: a window that waits p% of its time takes compute / (1 - p) a step."""
    return [{"step": every * i, "data_wait_pct": p, "step_ms": compute_ms / (1 - min(p, 99) / 100)}
            for i, p in enumerate(waits, 1)]


def wait_alerts(series: list[dict], **cfg) -> list[tuple[int, float]]:
    rules = RowRules(MonitorConfig(**cfg))
    return [(i, f.value) for i, r in enumerate(series) for f in rules.check(r) if f.rule == "data_wait"]


def test_a_loader_that_stalls_every_other_window_is_data_wait():
    got = wait_alerts(rows([5.0] + [85.0, 0.0] * 20))
    assert got and got[0][0] <= 4 and all(v > 75 for _, v in got)  # ~80% of the time waits


def test_one_long_stall_is_no_data_wait():
    waits = [5.0] * 40
    waits[20] = 99.0  # an epoch boundary: 100x a step's time, all of it waiting
    assert wait_alerts(rows(waits)) == []
    waits[21] = 60.0  # and the window after it a little slow
    assert wait_alerts(rows(waits)) == []


def test_a_loader_slow_all_along_is_data_wait_at_its_third_window():
    assert [i for i, _ in wait_alerts(rows([60.0] * 5))] == [2, 3, 4]
    assert wait_alerts(rows([40.0] * 10)) == []


def test_a_gpu_starved_in_a_pattern_is_gpu_util_low_and_one_idle_window_is_not():
    rules = RowRules(MonitorConfig())
    got = [i for i, u in enumerate([50, 2, 15, 3, 12, 4, 3]) for f in rules.check({"gpu_util_pct": u})]
    assert got == [5, 6]
    rules = RowRules(MonitorConfig())
    idle = [{"gpu_util_pct": u, "step_ms": 1e4 if u == 0 else 100} for u in [50, 11, 11, 0, 11, 11, 11]]
    assert [f.rule for r in idle for f in rules.check(r)] == []  # a checkpoint save: one long idle window

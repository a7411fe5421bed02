"""Red team, session 23, monitoring: planted faults must raise their rule once at their step, healthy runs none.
Found: a noisy loss "spiked" against a fixed 2x (small batches), a slow divergence (1% a log step) never rose 20%
within one 10-step window, a flat stretch ranked "in step order" (ties), a loss falling slowly was a plateau (the
best loss crept down without counting as progress), gradients that die or explode had no rule at all, a
loss_plateau_delta >= 1 made every window a plateau; report died on an alert whose rule is not a name, and
watch/report said nothing of a metrics.jsonl that lost the rows summary.json counts."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tests.faults.common import BASE_TOML, error_line, lit, rows
from turbotrain.cli import main
from turbotrain.errors import UserError
from turbotrain.monitor.rules import GradRules, LossRules, MonitorConfig

M = "userpkg.redteam_s23_monitor"
pytestmark = pytest.mark.usefixtures("userpkg_importable")


def loss_alerts(series: list[float], **cfg) -> list[tuple[str, int]]:
    rules = LossRules(MonitorConfig(**cfg))
    return [(f.rule, i) for i, x in enumerate(series, 1) for f in rules.check(x)]


def train(tmp_path: Path, *overrides: str) -> tuple[Path, list[tuple[int, str]]]:
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", 'monitor.trackers=["jsonl"]',
                 *overrides]) == 0
    run = tmp_path / "fault"
    path = run / "alerts.jsonl"
    got = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    # the timing rules answer the machine's load, not the plant
    return run, [(a["step"], a["rule"]) for a in got if a["rule"] not in ("throughput_drop", "data_wait")]


# ---------------------------------------------------------------- the loss rules, on synthetic series

@pytest.mark.parametrize("sigma", [0.2, 0.3])
@pytest.mark.parametrize("trend", [0.0, -3e-4])
def test_a_noisy_healthy_loss_raises_nothing(sigma, trend):
    """Small batches: the loss scatters ~25% around its level. A fixed 2x over the running average was
    crossed by chance every ~150 log steps."""
    rng = random.Random(1)
    series = [2.0 * math.exp(trend * i) * rng.lognormvariate(0, sigma) for i in range(2000)]
    assert loss_alerts(series, loss_plateau_window=0) == []


def test_a_spike_on_a_noisy_loss_still_fires_once():
    rng = random.Random(2)
    series = [2.0 * rng.lognormvariate(0, 0.3) for _ in range(200)]
    series[150] = 40.0
    assert loss_alerts(series, loss_plateau_window=0) == [("loss_spike", 151)]


@pytest.mark.parametrize("rate, first", [(1.01, 20), (1.005, 40)])
def test_a_slow_divergence_is_diverging(rate, first):
    """1% a log step doubles the loss in 70 log steps but never rises 20% within 10 of them."""
    rng = random.Random(3)
    series = [rate ** i * rng.lognormvariate(0, 0.01) for i in range(100)]
    got = loss_alerts(series, loss_plateau_window=0, loss_spike_factor=0)
    assert got and got[0] == ("loss_diverging", first) and {r for r, _ in got} == {"loss_diverging"}


def test_a_flat_stretch_ranks_in_no_order():
    """Equal losses took their place in the sort as their step order: flat, then one spike, read as a trend."""
    assert loss_alerts([1.0] * 40 + [5.0], loss_plateau_window=0) == [("loss_spike", 41)]


def test_a_loss_still_falling_slowly_is_no_plateau():
    """0.2% a log step is 10% in 50: progress. The best loss crept down by less than 1% each step and never
    counted as an improvement, so this was a plateau every 50 log steps."""
    assert loss_alerts([2.0 * 0.998 ** i for i in range(400)]) == []
    # and once it stops: one plateau a window after the running average settled (~18 log steps of lag)
    got = loss_alerts([2.0 * 0.998 ** i for i in range(100)] + [1.6] * 100)
    assert [r for r, _ in got] == ["loss_plateau"] and 150 <= got[0][1] <= 170


# ---------------------------------------------------------------- gradient rules

def test_noisy_gradient_norms_and_warm_up_raise_nothing():
    rng = random.Random(4)
    rules = GradRules()
    norms = [0.1 * 1.15 ** min(i, 20) * rng.lognormvariate(0, 0.6) for i in range(2000)]  # grows 16x, then noise
    assert [f.rule for g in norms for f in rules.check(g, 2.0, False)] == []
    rules = GradRules()  # a run that converges: small gradients at a small loss
    assert [f.rule for i in range(200) for f in rules.check(math.exp(-i / 5), 2 * math.exp(-i / 5), False)] == []


def test_a_lone_clipped_spike_in_warm_up_is_no_explosion_but_a_lasting_one_is():
    """The default preset's own gradient norms (gpt-shakespeare, CPU, steps 1-16): one clipped 14x spike in the LR
    warm-up of a healthy run. Two such log steps in a row, or one 100x, are an explosion."""
    healthy = [5.261, 3.992, 2.355, 1.899, 1.771, 1.675, 1.673, 26.477, 1.883, 1.556, 1.33, 2.064, 1.028, 1.794,
               1.319, 1.216]
    rules = GradRules()
    assert [f.rule for g in healthy for f in rules.check(g, 3.5, False)] == []
    rules = GradRules()
    lasting = healthy[:7] + [26.0, 30.0] + healthy[9:]
    assert [(i, f.rule) for i, g in enumerate(lasting) for f in rules.check(g, 3.5, False)] == [(8, "grad_exploding")]
    rules = GradRules()
    once = healthy[:7] + [400.0] + healthy[8:]
    assert [(i, f.rule) for i, g in enumerate(once) for f in rules.check(g, 3.5, False)] == [(7, "grad_exploding")]


def test_a_planted_gradient_explosion_is_one_grad_exploding_at_its_step(tmp_path):
    run, got = train(tmp_path, f'model.name="{M}:grad_blows_up_at"', "train.steps=14")
    norms = {r["step"]: r["grad_norm"] for r in rows(run) if "loss" in r}
    big = [s for s, g in norms.items() if g > 1e3]
    assert len(big) == 1 and got == [(big[0], "grad_exploding")]


@pytest.mark.parametrize("model, first_zero", [("dies_at", None), ("detached", 1)])
def test_gradients_that_die_are_one_grad_vanishing(tmp_path, model, first_zero):
    run, got = train(tmp_path, f'model.name="{M}:{model}"', "train.steps=12")
    zero = [r["step"] for r in rows(run) if "loss" in r and r["grad_norm"] == 0.0]
    assert zero and zero == list(range(zero[0], 13)) and zero[0] == (first_zero or zero[0])
    assert got == [(zero[0] + 2, "grad_vanishing")]  # the 3rd log step in a row


# ---------------------------------------------------------------- memory and healthy runs end to end

def test_a_leak_is_one_memory_growth_and_nothing_else(tmp_path):
    """40 MiB kept every step on the fault preset's noisy loss: the leak alone (the noise spiked before). Past
    glibc's largest mmap threshold (32 MiB) each block is fresh memory: a smaller one may reuse heap pages the test
    process freed earlier, and the RSS would not move."""
    _, got = train(tmp_path, f'model.name="{M}:leaks"', "model.args={mib=40}", "train.steps=24")
    assert [r for _, r in got] == ["memory_growth"]


def test_a_healthy_noisy_run_with_warm_up_raises_no_alert(tmp_path):
    """The fault preset's loss scatters 1.5 to 23 (noisy targets, small batches); warm-up over 10 steps."""
    _, got = train(tmp_path, "train.steps=40", "train.warmup_steps=10")
    assert got == []


# ---------------------------------------------------------------- config, watch and report

@pytest.mark.parametrize("delta", [1, 5.0])
def test_a_plateau_delta_of_the_whole_loss_is_refused(delta):
    with pytest.raises(UserError, match=r"loss_plateau_delta = .*must be < 1"):
        MonitorConfig(loss_plateau_delta=delta)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("s23")
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(out)}", 'monitor.trackers=["jsonl"]']) == 0
    return out / "fault"


@pytest.mark.parametrize("rule", ['["x"]', '{"a": 1}', "3", "null"])
def test_an_alert_whose_rule_is_not_a_name_is_unreadable_not_a_crash(finished, tmp_path, capsys, rule):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "alerts.jsonl").write_text('{"step": 2, "rule": "loss_spike", "message": "m"}\n'
                                      f'{{"step": 3, "rule": {rule}, "message": {{"a": 1}}}}\n')
    assert main(["report", str(run)]) == 0, capsys.readouterr().err
    md = (run / "report.md").read_text()
    assert "1 line of alerts.jsonl unreadable" in md and "| loss_spike |" in md
    assert main(["watch", str(run), "--once"]) == 0
    assert "1 line of alerts.jsonl unreadable" in capsys.readouterr().out


@pytest.mark.parametrize("keep", [0, 2])
def test_metrics_that_lost_rows_the_summary_counts_are_said(finished, tmp_path, capsys, keep):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:keep]))
    assert main(["watch", str(run), "--once"]) == 0
    out = capsys.readouterr().out
    assert "rows were lost" in out and "summary.json at step 4" in out
    assert main(["report", str(run)]) == 0
    assert "rows were lost" in (run / "report.md").read_text()
    shutil.copy(finished / "metrics.jsonl", run / "metrics.jsonl")  # whole again: nothing to say
    assert main(["watch", str(run), "--once"]) == 0
    assert "rows were lost" not in capsys.readouterr().out


def test_a_nonsense_threshold_is_one_error_line_before_the_run(tmp_path, capsys):
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "monitor.loss_plateau_delta=2"])
    assert rc == 2 and "loss_plateau_delta" in error_line(capsys.readouterr().err)
    assert not (tmp_path / "fault").exists()

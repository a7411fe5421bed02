"""Red-team cases of the monitor's verdicts and of the tool commands' inputs: a leak that raises the peak memory at
every log step is an alert; one slow window (the step after an evaluation or a save) and a noisy start of the loss
are not; watch on a run that logged no step yet says so; a huge --repeats / --active is a user error, not days of
runs."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.faults.common import BASE_TOML, error_line, lit
from tests.faults.test_monitor_redteam import Held
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.monitor.alerts import Alerts
from turbotrain.monitor.rules import LossRules, MonitorConfig, RowRules
from turbotrain.monitor.sinks import JsonlFile
from turbotrain.profile import run_profile
from turbotrain.report import load_run
from turbotrain.watch import frame

BASE = str(BASE_TOML)

pytestmark = pytest.mark.usefixtures("userpkg_importable")


# ---------------------------------------------------------------- memory growth

def _peaks(rules: RowRules, peaks) -> list[int]:
    return [i for i, p in enumerate(peaks) for f in rules.check({"peak_mem_gib": p}) if f.rule == "memory_growth"]


def test_a_peak_that_keeps_rising_is_a_memory_growth_alert():
    assert _peaks(RowRules(MonitorConfig()), [1.0 + 0.02 * i for i in range(20)])[:1] == [10]


@pytest.mark.parametrize("peaks", [
    [1.0] * 30,  # flat
    [1.0] * 5 + [1.5] * 25,  # one rise (the first evaluation, a checkpoint save)
    [1.0 + 0.001 * i for i in range(30)],  # creeping within noise: 3% in 30 log steps
])
def test_a_settled_peak_is_no_memory_alert(peaks):
    assert _peaks(RowRules(MonitorConfig()), peaks) == []


def test_warm_up_growth_and_the_off_switch_fire_nothing():
    rules = RowRules(MonitorConfig())
    assert all(rules.check({"peak_mem_gib": 1.0 + i}, warm=False) == [] for i in range(20))
    assert _peaks(RowRules(MonitorConfig(mem_growth_pct=0)), [1.0 + 0.1 * i for i in range(30)]) == []


def test_memory_growth_is_sent_once_by_rank_zero(tmp_path):
    """Through Alerts as the monitor calls it: one alerts.jsonl line (repeats held back), none from another rank
    (the row's peak is averaged over ranks)."""
    out = []
    for rank in (0, 1):
        a = Alerts(3, MonitorConfig(), rank=rank, jsonl=JsonlFile(tmp_path / f"a{rank}.jsonl"))
        for i in range(30):
            a.check_row({"step": i, "peak_mem_gib": 0.3 + 0.004 * i}, i)
        a.close()
        path = tmp_path / f"a{rank}.jsonl"
        out.append([json.loads(ln)["rule"] for ln in path.read_text().splitlines()] if path.exists() else [])
    assert out == [["memory_growth"], []]


# ---------------------------------------------------------------- no false alarms

def test_a_noisy_start_is_no_spike_against_the_first_loss_alone():
    """The losses fault.toml logs: the running average is the mean of them (5.08 at step 4), not 73% the first."""
    rules = LossRules(MonitorConfig(loss_plateau_window=0, loss_diverging_window=0))
    assert [f.rule for x in (1.79, 8.97, 4.47, 5.81, 4.80, 4.41) for f in rules.check(x)] == []
    assert [f.rule for f in rules.check(40.0)] == ["loss_spike"]  # a real one still is


def test_one_slow_window_after_an_eval_is_no_throughput_drop():
    rules = RowRules(MonitorConfig())
    rates = [100, 101, 99, 100, 50, 100, 99, 48, 101]  # windows right after an evaluation / a save
    assert [f.rule for r in rates for f in rules.check({"samples_per_s": r})] == []
    assert [f.rule for r in (40, 41) for f in rules.check({"samples_per_s": r})] == ["throughput_drop"]


# ---------------------------------------------------------------- watch / report of a run with no step yet

@pytest.fixture
def no_step(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(BASE, d / "config.toml")
    return d


def test_a_run_starting_up_is_running_with_no_step_yet(no_step, capsys):
    held = Held(no_step)
    try:
        run = load_run(no_step)
        assert run.state == "running" and "no step logged yet" in frame(run)
        assert main(["watch", str(no_step), "--once"]) == 0
    finally:
        held.release()
    assert "running (no step logged yet" in capsys.readouterr().out


def test_a_run_that_never_logged_is_said_so(no_step, capsys):
    assert main(["watch", str(no_step), "--once"]) == 2
    assert "logged no step" in error_line(capsys.readouterr().err)
    (no_step / "metrics.jsonl").mkdir()
    assert main(["report", str(no_step)]) == 2
    assert "metrics.jsonl is not a regular file" in error_line(capsys.readouterr().err)


# ---------------------------------------------------------------- huge counts are typos

@pytest.mark.parametrize("argv", [
    ["bench", BASE, "--repeats", "1000000"],
    ["scale", BASE, "--gpus", "1", "--repeats", "1000000"],
    ["tune", BASE, "--repeats", "1000000"],
    ["profile", BASE, "--active", "100000000"],
])
def test_a_huge_count_is_one_error_before_any_run(tmp_path, capsys, argv):
    assert main([*argv, f"run.out_dir={lit(tmp_path)}"]) == 2
    line = error_line(capsys.readouterr().err)
    assert ("--repeats must be at most 100" in line) or ("--active must be an integer from 1 to 200" in line)
    assert not any(tmp_path.iterdir())


def test_profile_api_refuses_a_count_that_is_not_one(tmp_path):
    cfg = load_config(BASE, [f"run.out_dir={lit(tmp_path)}"])
    for bad in (0, 10**6, 2.5, True):
        with pytest.raises(UserError, match="--active must be an integer"):
            run_profile(cfg, active=bad)

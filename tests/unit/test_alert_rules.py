"""Alert rules on synthetic series: each fires when it should and stays quiet when it should not; alerts
are rate-limited per rule; the watchdog fires on stopped beats only; the sinks' records have the contract's
fields; a webhook that never answers does not block."""
import json
import math
import socket
import threading
import time

import pytest

from turbotrain.errors import UserError
from turbotrain.monitor.alerts import Alerts, NonFiniteLoss
from turbotrain.monitor.rules import RULES, LossRules, MonitorConfig, RowRules, straggler
from turbotrain.monitor.sinks import JsonlFile, Webhook
from turbotrain.monitor.watchdog import Watchdog, thread_stacks

FIELDS = {"time", "step", "rank", "rule", "value", "threshold", "message"}


def cfg(**kw) -> MonitorConfig:
    return MonitorConfig(**kw)


def fired(rules, series, **row_extra) -> list[tuple[int, str]]:
    """(index, rule) of every alert over a series fed to LossRules (floats) or RowRules (dicts)."""
    out = []
    for i, x in enumerate(series):
        got = rules.check(x) if isinstance(rules, LossRules) else rules.check({**x, **row_extra})
        out += [(i, f.rule) for f in got]
    return out


def noisy_descent(n: int, seed: int = 0) -> list[float]:
    import random

    r = random.Random(seed)
    return [2.0 * math.exp(-i / 40) + 0.5 + r.uniform(-0.08, 0.08) for i in range(n)]


# ---------------------------------------------------------------- loss rules

def test_a_healthy_noisy_descent_fires_nothing():
    assert fired(LossRules(cfg(loss_plateau_window=0)), noisy_descent(300)) == []


def test_exponential_blowup_is_diverging_early():
    series = [1.0 * 1.3 ** i for i in range(20)]
    got = [i for i, r in fired(LossRules(cfg(loss_diverging_window=6)), series) if r == "loss_diverging"]
    assert got and got[0] == 5  # as soon as the window is full


def test_one_spike_is_a_spike_not_a_divergence():
    series = noisy_descent(40)
    series[30] = 10.0
    rules = [r for _, r in fired(LossRules(cfg()), series)]
    assert rules == ["loss_spike"]


def test_no_spike_in_the_first_log_steps():
    """A tiny run's second loss may double the first (seen in the fault tests): no alert that early."""
    assert fired(LossRules(cfg()), [1.0, 2.5, 1.0]) == []


def test_plateau_fires_after_its_window_and_not_while_improving():
    flat = [1.0 + 0.001 * (i % 2) for i in range(25)]
    got = fired(LossRules(cfg(loss_plateau_window=10)), flat)
    assert [r for _, r in got] == ["loss_plateau"] and got[0][0] == 10  # one alert per plateau
    assert fired(LossRules(cfg(loss_plateau_window=10)), [1.0 * 0.95 ** i for i in range(40)]) == []


def test_non_finite_losses_are_left_to_the_stop():
    assert fired(LossRules(cfg(loss_diverging_window=3, loss_spike_factor=0)), [1.0, math.nan, 2.0, math.inf, 3.0]) == \
        [(4, "loss_diverging")]


def test_rules_switch_off_with_zero():
    series = [1.3 ** i for i in range(30)]
    assert fired(LossRules(cfg(loss_diverging_window=0, loss_spike_factor=0, loss_plateau_window=0)), series) == []


# ---------------------------------------------------------------- row rules

def test_throughput_drop_against_the_median_of_earlier_windows():
    rates = [100, 104, 98, 101, 60, 99, 58, 57, 99]  # one slow window is a one-off cost; two in a row a drop
    got = fired(RowRules(cfg()), [{"samples_per_s": r} for r in rates])
    assert got == [(7, "throughput_drop")]
    # warm-up windows (compile) are neither judged nor part of the reference
    rr = RowRules(cfg())
    assert rr.check({"samples_per_s": 5.0}, warm=False) == [] and rr.rates == []


def test_data_wait_needs_a_streak():
    waits = [10, 60, 70, 80, 90, 10, 60, 60, 10, 60, 60, 60]
    got = fired(RowRules(cfg(data_wait_steps=3)), [{"data_wait_pct": w} for w in waits])
    assert got == [(3, "data_wait"), (4, "data_wait"), (11, "data_wait")]


def test_gpu_rules():
    c = cfg(gpu_util_low_steps=2)
    rows = [{"gpu_util_pct": 90, "gpu_temp_c": 70, "gpu_mem_pct": 50},
            {"gpu_util_pct": 5, "gpu_temp_c": 70, "gpu_mem_pct": 50},
            {"gpu_util_pct": 4, "gpu_temp_c": 91, "gpu_mem_pct": 97}]
    assert fired(RowRules(c), rows) == [(2, "gpu_util_low"), (2, "gpu_temp_high"), (2, "gpu_mem_high")]
    assert fired(RowRules(c), [{"samples_per_s": 1.0}] * 10) == []  # no NVML: nothing to judge


def test_sync_latency():
    assert fired(RowRules(cfg(sync_latency_ms=50)), [{"sync_ms": 3}, {"sync_ms": 80}]) == [(1, "sync_latency")]


def test_straggler_once_when_the_streak_reaches_its_patience():
    verdicts = [{}, {1: 1}, {1: 2}, {1: 3}, {}, {0: 1}]  # StragglerWatch.streak after each log step
    got = [(i, straggler(v, 2, 1.25, 1.8)) for i, v in enumerate(verdicts)]
    hits = [(i, g[0], g[1].rule) for i, g in got if g is not None]
    assert hits == [(2, 1, "straggler")] and "rank 1" in got[2][1][1].message


# ---------------------------------------------------------------- alerts: records, rate limit, ranks

class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_alert_records_are_rate_limited_per_rule(tmp_path):
    clock = Clock()
    a = Alerts(3, cfg(alert_repeat_s=60), jsonl=JsonlFile(tmp_path / "alerts.jsonl"), clock=clock)
    for step in range(10, 20):  # 10 windows of 99 % data wait: one alert, the repeats held
        a.check_row({"data_wait_pct": 99.0, "samples_per_s": 1.0}, step)
    clock.t += 61
    for step in range(20, 23):
        a.check_row({"data_wait_pct": 99.0, "samples_per_s": 1.0}, step)
    a.close()
    lines = [json.loads(x) for x in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [x["rule"] for x in lines] == ["data_wait", "data_wait"]
    assert all(set(x) == FIELDS for x in lines) and lines[0]["step"] == 12 and lines[0]["threshold"] == 50.0
    assert "more since the last" in lines[1]["message"] and a.counts["data_wait"] == 11  # every firing counts


def test_shared_rules_are_sent_by_rank_0_only(tmp_path):
    a = Alerts(3, cfg(), rank=1, jsonl=JsonlFile(tmp_path / "a.jsonl"))
    for i in range(20):
        a.check_loss(1.3 ** i, i, 0, final=False)  # diverging: every rank sees it, rank 0 says it
    a.check_row({"gpu_temp_c": 99}, 20)  # its own GPU: rank 1 says it
    a.close()
    rules = [json.loads(x)["rule"] for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert rules == ["gpu_temp_high"]


def test_non_finite_stop_is_recorded_then_raised(tmp_path):
    a = Alerts(2, cfg(), jsonl=JsonlFile(tmp_path / "a.jsonl"))
    with pytest.raises(NonFiniteLoss, match=r"NaN.*step 7"):
        a.check_loss(math.nan, step=7, bad_streak=2, final=False)
    a.close()
    line = json.loads((tmp_path / "a.jsonl").read_text())
    assert line["rule"] == "loss_nonfinite" and line["step"] == 7 and line["value"] == 2


def test_every_rule_name_is_known():
    assert len(set(RULES)) == 16 and {"hung_step", "straggler", "loss_nonfinite"} <= set(RULES)


@pytest.mark.parametrize("override, key", [({"prometheus_port": 70000}, "prometheus_port"),
                                           ({"webhook_url": "ftp://x"}, "webhook_url"),
                                           ({"data_wait_pct": 120}, "data_wait_pct"),
                                           ({"loss_diverging_window": 2}, "loss_diverging_window"),
                                           ({"hang_timeout_s": -1}, "hang_timeout_s")])
def test_bad_thresholds_are_refused_naming_the_key(override, key):
    with pytest.raises(UserError, match=f"monitor.{key}"):
        MonitorConfig(**override)


# ---------------------------------------------------------------- watchdog and webhook

def test_watchdog_fires_when_beats_stop_and_carries_the_stacks():
    got = []
    w = Watchdog(0.4, lambda since, step, stacks: got.append((since, step, stacks)), start_step=0)
    for step in range(1, 6):  # beats every 0.05 s: no alarm
        time.sleep(0.05)
        w.beat(step)
    assert got == []
    time.sleep(1.2)
    w.stop()
    assert len(got) == 1 and got[0][1] == 5 and got[0][0] > 0.4
    assert "Thread MainThread" in got[0][2] and "test_watchdog_fires" in got[0][2]


def test_thread_stacks_name_every_thread():
    ev = threading.Event()
    t = threading.Thread(target=ev.wait, name="stuck-reader", daemon=True)
    t.start()
    try:
        assert "Thread stuck-reader" in thread_stacks()
    finally:
        ev.set()


def test_a_webhook_that_never_answers_does_not_block_and_is_recorded(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)  # accepts connections, never answers
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/hook"
        hook = Webhook(url, timeout_s=0.3, retries=2, undelivered=JsonlFile(tmp_path / "undelivered.jsonl"))
        t0 = time.perf_counter()
        for i in range(5):
            hook.send({"rule": "data_wait", "step": i})
        assert time.perf_counter() - t0 < 0.05  # send never waits for the network
        hook.close(wait_s=0.5)
        assert time.perf_counter() - t0 < 2.0
    finally:
        srv.close()
    lines = [json.loads(x) for x in (tmp_path / "undelivered.jsonl").read_text().splitlines()]
    assert sorted(x["step"] for x in lines) == [0, 1, 2, 3, 4] and hook.failed == 5 and hook.sent == 0

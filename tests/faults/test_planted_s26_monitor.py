"""Red team, session 26 (monitoring): faults planted in real runs through the CLI's entry, on fault.toml's linear
regression (tests/userpkg/planted_s26_monitor.py). Found: a prometheus_addr that is no host name at all (an empty
or 64+ character label) ended the run with a UnicodeError traceback from the idna codec, not one error line; the
hung_step alert said when the run hung but not where (waiting for a batch, or inside the step) nor what to do; a
hang handler that failed left the watchdog's thread dead and the hung run hanging for ever; a loss gone NaN on a
batch holding NaN was alerted as "lower train.lr" (only the stop's error line named the data)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.faults.common import BASE_TOML, error_line, lit, subprocess_env, train_argv
from turbotrain.cli import main
from turbotrain.distributed.env import DistEnv
from turbotrain.monitor.run_monitor import RunMonitor, StepCost

pytestmark = pytest.mark.usefixtures("userpkg_importable")
PLANT = "userpkg.planted_s26_monitor"


@pytest.mark.parametrize("addr", ["nohost..", "a" * 64 + ".example", ".leading"])
def test_a_prometheus_address_that_is_no_host_name_is_one_error_line(capsys, tmp_path, addr):
    capsys.readouterr()
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "monitor.prometheus_port=9187",
               f"monitor.prometheus_addr={addr!r}"])
    _, err = capsys.readouterr()
    assert rc == 2
    line = error_line(err)
    assert "monitor.prometheus_addr" in line and "127.0.0.1" in line, line
    assert not (tmp_path / "fault").exists()  # refused before the run directory is touched


def _hang(tmp_path: Path, *overrides: str) -> tuple[int, str, list[dict]]:
    argv = train_argv(str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.steps=20", "monitor.hang_timeout_s=3",
                      *overrides)
    # to files: a left-behind worker would hold a pipe open (test_planted_s25b_monitor covers that it is not)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as o, err.open("w") as e:
        rc = subprocess.run(argv, cwd=tmp_path, env=subprocess_env(), stdout=o, stderr=e, timeout=120).returncode
    path = tmp_path / "fault" / "alerts.jsonl"
    alerts = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    return rc, out.read_text() + err.read_text(), [a for a in alerts if a["rule"] == "hung_step"]


@pytest.mark.parametrize("overrides,cause,not_cause", [
    # a read that never returns, in the main thread and in a loader worker
    (('data.name="userpkg.monitoring:blocks_at"', "data.args.after=40"), "waiting for the next batch", "step ("),
    (('data.name="userpkg.monitoring:blocks_at"', "data.args.after=40", "data.num_workers=1"),
     "waiting for the next batch", "step ("),
    # a forward that never returns (a collective whose peer is gone, a kernel stuck): the data is fine
    ((f'model.name="{PLANT}:stuck_forward"',), "stuck in the training step", "next batch")])
def test_a_hang_names_where_it_is_stuck_and_what_to_do(tmp_path, overrides, cause, not_cause):
    rc, output, hung = _hang(tmp_path, *overrides)
    assert rc == 1 and len(hung) == 1, output[-3000:]
    first = hung[0]["message"].split("\n", 1)[0]
    assert cause in first and not_cause not in first, first
    assert f"alert hung_step at step {hung[0]['step']}: " in output
    fix = "storage the data reads" if "batch" in cause else "raise monitor.hang_timeout_s"
    assert fix in first, first


def test_a_hang_handler_that_fails_still_ends_the_hung_process(tmp_path):
    """The handler writes to sinks that can fail in ways no one listed (a tracker, a closed file): its exception
    killed the watchdog's thread, and the stuck process, the one thing the watchdog is for, ran on for ever."""
    code = textwrap.dedent("""
        import threading
        from turbotrain.monitor.watchdog import Watchdog

        def on_hang(since, step, stacks):
            raise KeyError("a sink that failed")

        Watchdog(1.0, on_hang).beat(3)
        threading.Event().wait()  # the stuck loop
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "hung after step 3" in proc.stderr and "a sink that failed" in proc.stderr


@pytest.mark.parametrize("corrupt,part", [(lambda x, y: (x * torch.nan, y), "inputs"),
                                          (lambda x, y: (x, y + torch.inf), "targets"), (None, None)])
def test_a_non_finite_loss_on_a_batch_holding_nan_names_the_data_not_the_lr(tmp_path, capsys, corrupt, part):
    """A corrupt shard mid-run: the loss went NaN at a log step on a batch whose inputs were NaN, and the
    loss_nonfinite alert (console, alerts.jsonl, webhook) said "lower train.lr", though the batch was read right
    there; only the stop's error line, rebuilt by the trainer, named the data. A clean batch under weights that
    overflowed still names the LR."""
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(8, 1)
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
    if corrupt is None:  # weights blown up to inf: the batch is clean, the step is what broke
        with torch.no_grad():
            model.weight.fill_(torch.inf)
    else:
        x, y = corrupt(x, y)
    cost = StepCost(global_batch=8, tokens_per_sample=None, flops_per_sample=1.0, flops_source="test",
                    peak_flops=None)
    monitor = RunMonitor(tmp_path, DistEnv(), torch.device("cpu"), cost, steps=10, start_step=0, max_bad_steps=3,
                         straggler_ratio=0.0)
    try:
        loss = nn.functional.mse_loss(model(x), y)
        monitor.after_step(1, loss)
        monitor.write(monitor.measure(1, loss, None, 0.1, 0.0, batch=[(x, y)]), 0.0)
    finally:
        monitor.close()
    alerts = [json.loads(ln) for ln in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [a["rule"] for a in alerts] == ["loss_nonfinite"], alerts
    message = alerts[0]["message"]
    if part is None:
        assert "lower train.lr" in message and "batch holds" not in message, message
    else:
        assert f"batch holds NaN/inf in its {part}" in message and "clean the data" in message, message
        assert "lower train.lr" not in message, message
    assert message.split(";")[1].strip()[:20] in capsys.readouterr().out

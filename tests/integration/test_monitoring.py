"""Monitoring end to end on sub-second CPU runs (tests/userpkg/fault.toml): a diverging run alerts before its
loss turns non-finite (file + webhook); data that turns slow half-way alerts once per window; a webhook that
never answers stalls nothing; /metrics answers during a run; a blocked dataset ends the run through the
watchdog with the stuck stack; report and watch draw any finished run."""
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import USERPKG, count_host_reads, userpkg_env
from turbotrain.callbacks import Callback
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.monitor.alerts import NonFiniteLoss
from turbotrain.trainer import train

FAULT = str(USERPKG / "fault.toml")
FIELDS = {"time", "step", "rank", "rule", "value", "threshold", "message"}


def fault_cfg(tmp_path, *overrides):
    return load_config(FAULT, [f"run.out_dir={str(tmp_path)!r}", *overrides])


def alerts(run_dir) -> list[dict]:
    path = run_dir / "alerts.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posted.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def webhook_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    srv.posted = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_diverging_run_alerts_before_the_loss_turns_non_finite(tmp_path, webhook_server):
    url = f"http://127.0.0.1:{webhook_server.server_address[1]}/alerts"
    cfg = fault_cfg(tmp_path, 'train.optimizer="sgd"', "train.lr=2.0", "train.grad_clip=0", "train.steps=80",
                    f"monitor.webhook_url={url!r}")
    with pytest.raises(NonFiniteLoss, match=r"NaN.*step \d+"):  # the non-finite stop works as before
        train(cfg)
    run = tmp_path / "fault"
    first_bad = next(r["step"] for r in rows(run) if r["loss"] is None)
    lines = alerts(run)
    div = [a for a in lines if a["rule"] == "loss_diverging"]
    assert len(div) == 1 and div[0]["step"] < first_bad and set(div[0]) == FIELDS
    assert div[0]["value"] > div[0]["threshold"] == 0.2
    assert [a["rule"] for a in lines][-1] == "loss_nonfinite"
    # the row of the step that ended the run is written, with its NaN: the metrics and the alert agree
    assert rows(run)[-1]["step"] == lines[-1]["step"] and rows(run)[-1]["loss"] is None
    assert rows(run)[-1]["nonfinite"]["loss"] in ("NaN", "Infinity")  # strict JSON: null, named beside it
    deadline = time.time() + 5  # delivery is asynchronous (the run's close waits for it, bounded)
    while len(webhook_server.posted) < len(lines) and time.time() < deadline:
        time.sleep(0.05)
    assert webhook_server.posted == lines  # the same JSON objects, in order


def test_slow_data_alerts_once_per_window_and_a_dead_webhook_stalls_nothing(tmp_path):
    """The loader turns 10x slower at step 20 of 40: throughput_drop and data_wait once each (repeats are
    held for monitor.alert_repeat_s). The webhook accepts connections and never answers: nothing waits."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead.listen(8)
    url = f"http://127.0.0.1:{dead.getsockname()[1]}/"
    try:
        t0 = time.perf_counter()
        summary = train(fault_cfg(tmp_path, 'data.name="userpkg.monitoring:slow_after"', "data.args.after=160",
                                  "data.args.delay=0.015",  # 120 ms of reads a step: >90 % wait even under load
                                  "train.steps=40", "train.log_every=2", "monitor.throughput_drop_ratio=0.3",
                                  f"monitor.webhook_url={url!r}", "monitor.webhook_timeout_s=1.0",
                                  "monitor.webhook_retries=2",
                                  "monitor.data_wait_pct=85"))  # a loaded machine's healthy tiny steps wait ~50 %
        wall = time.perf_counter() - t0
    finally:
        dead.close()
    run = tmp_path / "fault"
    by_rule = {}
    for a in alerts(run):
        by_rule.setdefault(a["rule"], []).append(a)
    assert len(by_rule["throughput_drop"]) == 1 and by_rule["throughput_drop"][0]["step"] >= 18
    assert len(by_rule["data_wait"]) == 1 and by_rule["data_wait"][0]["step"] >= 22
    assert summary["alerts"]["data_wait"] > 1  # fired on each later log step, sent once
    # each alert's POST hangs for 2 x 1 s: had one blocked the loop, a 2-step window would take > 1 s
    assert max(r["step_ms"] for r in rows(run)) < 400 and wall < 15
    undelivered = [json.loads(x) for x in (run / "alerts_undelivered.jsonl").read_text().splitlines()]
    assert {a["rule"] for a in undelivered} >= {"throughput_drop", "data_wait"}
    assert summary["alerts_undelivered"] == len(undelivered)

    # report and watch on this finished run
    assert main(["report", str(run)]) == 0
    from PIL import Image

    img = Image.open(run / "report.png")
    assert img.format == "PNG" and img.size[0] > 800 and img.size[1] > 600
    assert img.info["Description"] == "panels: loss; throughput; MFU; memory; GPU utilisation / temperature; data wait"
    assert len(img.convert("L").getcolors(maxcolors=1 << 16) or []) > 20  # drawn, not blank
    md = (run / "report.md").read_text()
    assert "![panels](report.png)" in md and "| last step | 40 |" in md
    assert "throughput_drop" in md and "data_wait" in md


def test_watch_renders_a_finished_run(tmp_path, capsys):
    train(fault_cfg(tmp_path, "train.steps=6"))
    assert main(["watch", str(tmp_path / "fault"), "--once"]) == 0
    out = capsys.readouterr().out
    n = len(alerts(tmp_path / "fault"))  # a tiny run may well have a loss_spike
    assert "[finished]" in out and "step 6" in out and f"alerts ({n}):" in out
    spark = next(line for line in out.splitlines() if line.startswith("loss   "))
    assert len(spark.split()[1]) == 6 and set(spark.split()[1]) <= set("▁▂▃▄▅▆▇█")


class Scrape(Callback):
    def __init__(self, port: int):
        self.port, self.text = port, ""

    def on_step_end(self, state):
        if state.step == 6:  # rows of steps 1-5 were written: the gauges hold step 5
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                self.text = r.read().decode()


def test_prometheus_serves_step_loss_and_throughput_during_the_run(tmp_path):
    pytest.importorskip("prometheus_client")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scrape = Scrape(port)
    train(fault_cfg(tmp_path, "train.steps=8", f"monitor.prometheus_port={port}",
                    'monitor.prometheus_addr="127.0.0.1"'), callbacks=[scrape])
    metrics = {line.split("{")[0]: line for line in scrape.text.splitlines() if not line.startswith("#")}
    assert metrics["turbotrain_step"].endswith(" 5.0")
    loss5 = rows(tmp_path / "fault")[4]["loss"]
    assert float(metrics["turbotrain_loss"].split()[-1]) == pytest.approx(loss5)
    assert float(metrics["turbotrain_samples_per_s"].split()[-1]) > 0
    with pytest.raises(OSError):  # the endpoint is gone with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_blocked_dataset_ends_the_run_with_the_stuck_stack(tmp_path):
    """Item 25 never returns (step 4 of 8 items a step): after hang_timeout_s without a step, the watchdog
    writes the hung_step alert with every thread's stack and the process exits non-zero."""
    cmd = [sys.executable, "-m", "turbotrain", "train", FAULT, f"run.out_dir={str(tmp_path)!r}", "train.steps=40",
           'data.name="userpkg.monitoring:blocks_at"', "data.args.after=24", "monitor.hang_timeout_s=2"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=userpkg_env())
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    hung = [a for a in alerts(tmp_path / "fault") if a["rule"] == "hung_step"]
    assert len(hung) == 1 and set(hung[0]) == FIELDS and hung[0]["threshold"] == 2.0 and hung[0]["value"] > 2
    assert "in __getitem__" in hung[0]["message"] and "threading.Event().wait()" in hung[0]["message"]
    assert "Thread MainThread" in r.stderr and "alert hung_step" in r.stdout
    steps = [row["step"] for row in rows(tmp_path / "fault")]
    assert hung[0]["step"] == steps[-1] < 5
    assert time.perf_counter() - t0 < 60


def _host_reads(monkeypatch, tmp_path, name, *extra) -> int:
    """Tensor values read on the host (a device sync on a GPU) over a 12-step run with one log step."""
    return count_host_reads(monkeypatch, lambda: train(fault_cfg(tmp_path, f"run.name={name}", "train.steps=12",
                                                                 "train.log_every=100", *extra)))


def test_all_monitoring_on_adds_no_device_sync_to_the_step(tmp_path, monkeypatch, webhook_server):
    pytest.importorskip("prometheus_client")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{webhook_server.server_address[1]}/"
    plain = _host_reads(monkeypatch, tmp_path, "plain")
    on = ["monitor.hang_timeout_s=60", f"monitor.prometheus_port={port}", 'monitor.prometheus_addr="127.0.0.1"',
          f"monitor.webhook_url={url!r}", "monitor.gpu_util_low_steps=1", "monitor.data_wait_steps=1",
          "monitor.loss_plateau_window=1"]
    everything = _host_reads(monkeypatch, tmp_path, "all", *on)
    assert everything == plain

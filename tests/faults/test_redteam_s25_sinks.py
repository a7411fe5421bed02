"""Red team, session 25, what a run records. Found: a NaN loss was written to metrics.jsonl as a bare `NaN` (and a
the alert sinks would write any NaN given to them the same way): not JSON, so jq, JavaScript
and strict parsers refused the whole file; TensorBoard left a NaN loss out, so its curve ended on the last finite
value and hid what stopped the run; a W&B / MLflow server failing mid-run ended hours of training."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.faults.common import BASE_TOML, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.monitor import sinks
from turbotrain.monitor.trackers import JsonlTracker, TensorBoardTracker
from turbotrain.report import load_run
from turbotrain.trainer import train

pytestmark = pytest.mark.usefixtures("userpkg_importable")


def strict(path: Path) -> list[dict]:
    """The lines of a JSON-lines file as a strict parser reads them: NaN / Infinity refused."""
    def refuse(name):
        raise AssertionError(f"{path.name} holds {name}, which is not JSON")

    return [json.loads(ln, parse_constant=refuse) for ln in path.read_text().splitlines()]


def run_cli(out: Path, *overrides: str) -> tuple[int, Path]:
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(out)}", 'monitor.trackers=["jsonl"]', *overrides])
    return rc, out / "fault"


def test_a_run_stopped_by_a_nan_loss_writes_json_and_still_reads_as_nan(tmp_path, capsys):
    rc, run = run_cli(tmp_path, 'model.name="userpkg.models:nan_from_start"')
    assert rc == 2
    rows = strict(run / "metrics.jsonl")
    assert rows and all(r["loss"] is None and r["nonfinite"] == {"loss": "NaN"} for r in rows)
    strict(run / "alerts.jsonl")
    capsys.readouterr()
    assert main(["watch", "--once", str(run)]) == 0
    assert f"step {rows[-1]['step']}   loss nan" in capsys.readouterr().out
    assert main(["report", str(run)]) == 0
    assert "| final loss | nan |" in (run / "report.md").read_text()
    assert math.isnan(load_run(run).last_row["loss"])


def test_a_nan_validation_loss_run_writes_json(tmp_path):
    rc, run = run_cli(tmp_path, 'model.name="userpkg.redteam2:eval_nan"', "model.args={}", "train.eval_every=2")
    assert rc == 0
    assert [a["rule"] for a in strict(run / "alerts.jsonl")] == ["loss_nonfinite"]
    assert [r.get("val_loss", 0) for r in strict(run / "metrics.jsonl")] == [0, None, 0, None]
    json.loads((run / "summary.json").read_text(), parse_constant=lambda name: pytest.fail(f"summary.json: {name}"))


@pytest.mark.parametrize("value, spelt", [(math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")])
def test_every_json_file_of_a_run_writes_non_finite_numbers_as_null(tmp_path, value, spelt):
    """The class: metrics rows (any key, a callback's too), alert lines, undelivered alerts (a webhook's body)."""
    tracker = JsonlTracker(tmp_path)
    tracker.log({"step": 1, "loss": value, "extra": [1.0, value]})
    tracker.close()
    alerts = sinks.JsonlFile(tmp_path / "alerts.jsonl")
    alerts.write({"step": 1, "rule": "r", "value": value, "threshold": 1.0})
    alerts.close()
    (row,), (alert,) = strict(tmp_path / "metrics.jsonl"), strict(tmp_path / "alerts.jsonl")
    assert row == {"step": 1, "loss": None, "extra": [1.0, None], "nonfinite": {"loss": spelt}}
    assert alert["value"] is None and alert["nonfinite"] == {"value": spelt}
    assert load_run(tmp_path).rows[0]["loss"] == pytest.approx(value, nan_ok=True)


def test_tensorboard_holds_the_nan_loss_at_its_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(tmp_path)
    for step, loss in [(1, 2.0), (2, 1.5), (3, math.nan)]:
        tracker.log({"step": step, "loss": loss, "grad_norm": None})
    tracker.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert got[:2] == [(1, 2.0), (2, 1.5)] and got[2][0] == 3 and math.isnan(got[2][1])
    assert sorted(acc.Tags()["scalars"]) == ["loss"]  # no "step" tag, no null grad_norm


class RemoteGoneAway:
    """A dashboard elsewhere (as W&B and MLflow are) whose server stops answering at the 2nd row."""

    best_effort = True
    rows: list = []

    def __init__(self, run_dir=None, start_step=0):
        RemoteGoneAway.rows = []

    def log(self, row):
        if len(self.rows) == 1:
            raise RuntimeError("API request to https://tracking.example/api failed with 503")
        self.rows.append(row["step"])

    def close(self):
        raise RuntimeError("finish: server unreachable")


def test_a_best_effort_tracker_failing_mid_run_is_turned_off_not_the_run(tmp_path, capsys):
    cfg = load_config(BASE_TOML, [f"run.out_dir={lit(tmp_path)}", "train.steps=4",
                                  f'monitor.trackers=["jsonl", "{__name__}:RemoteGoneAway"]'])
    summary = train(cfg)
    out = capsys.readouterr().out
    assert summary["steps"] == 4 and RemoteGoneAway.rows == [1]
    assert [r["step"] for r in strict(tmp_path / "fault" / "metrics.jsonl")] == [1, 2, 3, 4]
    warning = next(ln for ln in out.splitlines() if "RemoteGoneAway failed at step 2" in ln)
    assert "turned off" in warning and "503" in warning


def test_a_per_rank_prometheus_port_past_65535_is_a_user_error():
    """prometheus_port = 65535 passes the config load; LOCAL_RANK 1 adds one: bind() raised an OverflowError."""
    from turbotrain.errors import UserError
    from turbotrain.monitor.rules import MonitorConfig

    cfg = MonitorConfig(prometheus_port=65535, prometheus_per_rank=True, prometheus_addr="127.0.0.1")
    with pytest.raises(UserError, match="65536 .*prometheus_per_rank"):
        cfg.check_sinks(local_rank=1, is_main=False)
    with pytest.raises(UserError, match="past 65535"):
        sinks.Prometheus(65536, "127.0.0.1", 1)


def test_a_file_where_the_tensorboard_folder_goes_is_named_as_such(tmp_path):
    from turbotrain.errors import UserError

    (tmp_path / "tb").write_text("")
    with pytest.raises(UserError, match="tb is not a folder.*remove it"):
        TensorBoardTracker(tmp_path)


def test_the_report_of_a_resumed_run_says_its_speed_is_of_the_last_attempt(tmp_path):
    from turbotrain.report import render_markdown

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 9)))
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 8, "samples_per_s": 100.0, "resumed_from": 4}))
    md = render_markdown(load_run(tmp_path), "report.png")
    assert "| samples/s (timed region, steps after the resume at 4) | 100 |" in md


def test_a_webhook_that_redirects_is_undelivered_not_counted_sent(tmp_path):
    """urllib follows a 301 from a POST as a GET without the body: the new address answered 200 and the alert
    counted as delivered, though nobody received it (an http:// URL of an https:// service does this)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(301 if self.path == "/old" else 200)
            self.send_header("Location", "/new")
            self.end_headers()

        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        hook = sinks.Webhook(f"http://127.0.0.1:{srv.server_port}/old", 5.0, 1,
                             sinks.JsonlFile(tmp_path / "alerts_undelivered.jsonl"))
        hook.send({"step": 1, "rule": "loss_nonfinite", "value": math.nan})
        hook.close(wait_s=10.0)
    finally:
        srv.shutdown()
        srv.server_close()
    assert (hook.sent, hook.failed) == (0, 1)
    (undelivered,) = strict(tmp_path / "alerts_undelivered.jsonl")
    assert f"redirected to http://127.0.0.1:{srv.server_port}/new" in undelivered["error"]
    assert [json.loads(b) for b in bodies] == [{"step": 1, "rule": "loss_nonfinite", "value": None,
                                                "nonfinite": {"value": "NaN"}}]  # the body itself strict JSON


def test_a_missing_tensorboard_is_a_warning_with_its_fix(tmp_path, monkeypatch, capsys):
    import sys

    from turbotrain.monitor.trackers import build_tracker

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    assert build_tracker("tensorboard", tmp_path) is None
    out = capsys.readouterr().out
    assert "warning:" in out and "pip install tensorboard" in out and "monitor.trackers" in out

"""Trackers: CSV, W&B (offline) and MLflow (a store inside the run directory) receive the rows of metrics.jsonl;
TensorBoard after a resume holds each step once; a checkpoint save never reads as a throughput drop.
W&B and MLflow are optional extras (turbotrain[trackers]): their tests are skipped where they are not installed."""
import csv
import json
import math

import pytest

from tests.faults.common import BASE_TOML, CrashAt, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.trainer import train

BASE = str(BASE_TOML)


pytestmark = pytest.mark.usefixtures("userpkg_importable")


def jsonl(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def by_step(rows, key="loss") -> dict[int, float]:
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key) not in (None, "")}


def run(tmp_path, trackers, *overrides) -> "Path":  # noqa: F821
    assert main(["train", BASE, f"run.out_dir={lit(tmp_path)}", "train.steps=6", "train.eval_every=3",
                 f"monitor.trackers={json.dumps(trackers)}", *overrides]) == 0
    return tmp_path / "fault"


def test_csv_holds_the_rows_of_metrics_jsonl(tmp_path):
    run_dir = run(tmp_path, ["jsonl", "csv"])
    rows = jsonl(run_dir)
    with open(run_dir / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and any("val_loss" in r for r in rows)  # eval rows widened the header once
    for key in ("loss", "lr", "val_loss"):
        assert by_step(table, key) == pytest.approx(by_step(rows, key), rel=1e-12), key


def wandb_history(run_dir) -> list[dict]:
    """The history records of the offline W&B run in {run_dir}/wandb, read from its .wandb transaction log
    (LevelDB log format: 32 KiB blocks of records `crc32, length, type, data`; the data: protobuf Records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, block, buf, out = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        buf, pos = buf + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return out


def test_wandb_offline_receives_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = run(tmp_path, ["jsonl", "wandb"])
    history = [h for h in wandb_history(run_dir) if "_step" in h]
    rows = jsonl(run_dir)
    for key in ("loss", "lr", "val_loss"):
        got = {int(h["_step"]): h[key] for h in history if key in h}
        assert got == pytest.approx(by_step(rows, key), rel=1e-12), key


def test_mlflow_receives_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny: the file store (MLflow >= 3.7 asks)
    run_dir = run(tmp_path, ["jsonl", "mlflow"])
    store = run_dir / "mlflow"
    uri = f"sqlite:///{store / 'mlflow.db'}" if (store / "mlflow.db").exists() else store.as_uri()
    client = MlflowClient(tracking_uri=uri)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("turbotrain").experiment_id])
    rows = jsonl(run_dir)
    for key in ("loss", "lr", "val_loss"):
        got = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, key)}
        assert got == pytest.approx(by_step(rows, key), rel=1e-12), key


def test_a_missing_tracker_package_is_one_line(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    assert main(["train", BASE, f"run.out_dir={lit(tmp_path)}", 'monitor.trackers=["wandb"]']) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: monitor.trackers names 'wandb' but wandb is not installed: pip install wandb")
    assert "\n" not in err


class RecordingTracker:
    """A tracker of the user's own, named in the config as "pkg.module:factory"."""

    rows: list = []

    def __init__(self, run_dir, start_step):
        self.run_dir = run_dir

    def log(self, row):
        RecordingTracker.rows.append(row)

    def close(self):
        RecordingTracker.rows.append("closed")


def test_a_tracker_of_your_own_from_the_config(tmp_path):
    RecordingTracker.rows.clear()
    run_dir = run(tmp_path, ["tensorboard", "tests.integration.test_trackers:RecordingTracker"])
    assert RecordingTracker.rows[:-1] == jsonl(run_dir) and RecordingTracker.rows[-1] == "closed"
    assert (run_dir / "tb").is_dir()  # and the built-in ones beside it


def test_tracker_names_are_checked():
    from turbotrain.monitor.trackers import tracker_problem

    assert tracker_problem("csv") is None and tracker_problem("pkg.mod:make") is None
    assert "expected one of jsonl, tensorboard, csv, wandb, mlflow" in tracker_problem("neptune")


def tb_scalars(tb_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_after_a_resume_holds_each_step_once(tmp_path):
    cfg = load_config(BASE, [f"run.out_dir={lit(tmp_path)}", "train.steps=8", "checkpoint.every=4"])
    # a callback's exception ends the run as a user error naming it (turbotrain.plugins.call_user)
    with pytest.raises(UserError, match="crash for the test"):
        train(cfg, callbacks=[CrashAt(7)])  # logs steps 1-6, the checkpoint at 4: steps 5 and 6 are redone
    summary = train(cfg)
    assert summary["resumed_from"] == 4
    run_dir = tmp_path / "fault"
    loss = tb_scalars(run_dir / "tb", "loss")
    assert [s for s, _ in loss] == list(range(1, 9))  # each step once, in order
    assert dict(loss) == pytest.approx(by_step(jsonl(run_dir)), rel=1e-6)  # the resumed run's values (float32)


class SlowSave:
    """A checkpoint save that takes 0.3 s (a slow filesystem, an upload in on_checkpoint): far longer than the log
    windows of this millisecond workload, so a save counted as training reads as a drop of >90 %."""

    def on_checkpoint(self, state, path):
        import time

        time.sleep(0.3)


def test_no_throughput_drop_warning_after_a_checkpoint_save(tmp_path, capsys):
    # throughput_drop_ratio 0.25: a loaded CI machine's noise (windows of 4 steps vary ~2x) stays quiet; a save
    # counted as training (windows 10-50x slower) would not
    cfg = load_config(BASE, [f"run.out_dir={lit(tmp_path)}", "train.steps=32", "train.log_every=4",
                             "checkpoint.every=8", "data.args.n=256", "monitor.throughput_drop_ratio=0.25"])
    train(cfg, callbacks=[SlowSave()])
    out = capsys.readouterr().out
    assert len(list((tmp_path / "fault" / "checkpoints").iterdir())) >= 1  # saves did happen
    assert "alert throughput_drop" not in out, [ln for ln in out.splitlines() if "alert" in ln]
    alerts = tmp_path / "fault" / "alerts.jsonl"
    lines = alerts.read_text().splitlines() if alerts.exists() else []
    assert not [a for a in map(json.loads, lines) if a["rule"] == "throughput_drop"]
    rates = [r["samples_per_s"] for r in jsonl(tmp_path / "fault") if "samples_per_s" in r]
    assert all(math.isfinite(x) and x > 0 for x in rates)


def test_a_resume_in_the_second_its_crashed_run_started_is_still_read_last(tmp_path, monkeypatch):
    """Event file names compare their pid and counter as text: a counter going from 9 to 10 within one second
    sorts the resumed run's file first, and TensorBoard would apply its purge before the old steps."""
    from turbotrain.monitor.trackers import TensorBoardTracker

    uid = iter([9, 10])
    monkeypatch.setattr("tensorboard.summary.writer.event_file_writer._global_uid.get", lambda: next(uid))
    first = TensorBoardTracker(tmp_path)
    for step in range(1, 7):
        first.log({"step": step, "loss": float(step)})
    first.close()
    resumed = TensorBoardTracker(tmp_path, start_step=4)
    for step in range(5, 9):
        resumed.log({"step": step, "loss": 10.0 + step})
    resumed.close()
    loss = tb_scalars(tmp_path / "tb", "loss")
    assert loss == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 15.0), (6, 16.0), (7, 17.0), (8, 18.0)]

"""A full disk (or a file that may not grow) while metrics are written is a user error: one `error:` line naming
the file and the fix, exit 2, no traceback (none from TensorBoard's writer thread either), and the metrics
written so far stay whole: metrics.jsonl / metrics.csv end with the last whole row and a resume continues them.
No root needed: the disk "fills" by pointing the metrics file's descriptor at /dev/full (ENOSPC on every
write), or by a file size limit (RLIMIT_FSIZE: the kernel writes part of a row, then refuses the rest).
Also: `tune --budget-min` refuses a budget that is not a finite number of minutes up to a week."""
from __future__ import annotations

import csv
import json
import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.faults.common import BASE_TOML, error_line, lit, rows
from tests.helpers import TESTS, USERPKG
from turbotrain.callbacks import Callback
from turbotrain.cli import main
from turbotrain.errors import UserError
from turbotrain.monitor.logger import MetricsLogger
from turbotrain.monitor.trackers import CsvTracker, JsonlTracker

BASE = str(BASE_TOML)
HAS_DEV_FULL = os.path.exists("/dev/full") and os.path.isdir("/proc/self/fd")
needs_dev_full = pytest.mark.skipif(not HAS_DEV_FULL, reason="needs /dev/full and /proc/self/fd (Linux)")

# What FillDisk (a callback, built by the trainer from train.callbacks) does at which step: the row of that
# step is the first one that meets the full disk (on_log runs just before the row is written).
FAULT: dict = {"at": None, "action": None}


class FillDisk(Callback):
    def on_log(self, state):
        if state.step == FAULT["at"]:
            FAULT["action"](state.run_dir)


@pytest.fixture(autouse=True)
def _fault_reset(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    FAULT.update(at=None, action=None)
    yield
    FAULT.update(at=None, action=None)


def point_at_dev_full(path: Path) -> None:
    """From now on every write to `path` fails with ENOSPC, whoever holds it open: each descriptor of this
    process open on it is replaced by one open on /dev/full."""
    target, hit = os.path.realpath(path), 0
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == target:
                    os.dup2(full, int(fd))
                    hit += 1
            except OSError:  # the descriptor listing /proc/self/fd itself, gone by now
                pass
    finally:
        os.close(full)
    assert hit, f"no descriptor open on {path}"


def train(capsys, tmp_path, trackers, *overrides) -> tuple[int, str]:
    rc = main(["train", BASE, f"run.out_dir={lit(tmp_path)}", "train.steps=8", "train.log_every=1",
               f"monitor.trackers={json.dumps(trackers)}", f"train.callbacks={json.dumps([__name__ + ':FillDisk'])}",
               *overrides])
    return rc, capsys.readouterr().err


def steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in rows(run_dir)]  # every line must parse: json.loads raises on half a row


def csv_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert all(None not in r and None not in r.values() for r in got), got  # no short (cut) line
    return [int(r["step"]) for r in got]


@needs_dev_full
def test_full_disk_at_metrics_jsonl_is_one_error_line(tmp_path, capsys):
    FAULT.update(at=3, action=lambda run_dir: point_at_dev_full(run_dir / "metrics.jsonl"))
    rc, err = train(capsys, tmp_path, ["jsonl"])
    line = error_line(err)  # exactly one line, no traceback (and none from close() after the failed write)
    assert rc == 2, err
    assert "metrics.jsonl" in line and "No space left on device" in line and "free space" in line, line
    assert "run.out_dir" in line, line
    assert steps(tmp_path / "fault") == [1, 2]


@needs_dev_full
def test_full_disk_at_metrics_csv_is_one_error_line(tmp_path, capsys):
    FAULT.update(at=3, action=lambda run_dir: point_at_dev_full(run_dir / "metrics.csv"))
    rc, err = train(capsys, tmp_path, ["jsonl", "csv"])
    line = error_line(err)
    assert rc == 2, err
    assert "metrics.csv" in line and "No space left on device" in line, line
    assert csv_steps(tmp_path / "fault") == [1, 2]
    assert steps(tmp_path / "fault") == [1, 2, 3]  # jsonl comes first and had room


@needs_dev_full
def test_a_resume_after_a_full_disk_continues_the_metrics(tmp_path, capsys):
    FAULT.update(at=5, action=lambda run_dir: point_at_dev_full(run_dir / "metrics.jsonl"))
    rc, err = train(capsys, tmp_path, ["jsonl", "csv"], "checkpoint.every=2")
    assert rc == 2 and "metrics.jsonl" in error_line(err), err
    FAULT.update(at=None)  # space freed: the same command resumes from the step-4 checkpoint
    rc, err = train(capsys, tmp_path, ["jsonl", "csv"], "checkpoint.every=2")
    assert rc == 0, err
    assert steps(tmp_path / "fault") == list(range(1, 9))
    assert csv_steps(tmp_path / "fault") == list(range(1, 9))


def test_full_disk_under_tensorboard_is_one_error_line(tmp_path, capsys, monkeypatch):
    """TensorBoard writes from a thread: its ENOSPC comes back as the UserError, and the thread prints nothing."""
    record_writer = pytest.importorskip("tensorboard.summary.writer.record_writer")
    full = threading.Event()
    write = record_writer.RecordWriter.write

    def write_unless_full(self, data):
        if full.is_set():
            raise OSError(28, os.strerror(28))  # ENOSPC
        return write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", write_unless_full)
    printed = []  # what Python would print as "Exception in thread ..."
    monkeypatch.setattr(threading, "excepthook", printed.append)
    FAULT.update(at=3, action=lambda run_dir: full.set())
    rc, err = train(capsys, tmp_path, ["jsonl", "tensorboard"])
    for t in threading.enumerate():  # the writer thread is done with its exception (and its hook) by now
        if type(t).__name__ == "_AsyncWriterThread":
            t.join(timeout=10)
    line = error_line(err)
    assert rc == 2, err
    assert "tensorboard" in line and str(tmp_path / "fault" / "tb") in line, line
    assert "No space left on device" in line and "free space" in line, line
    assert printed == [], [(a.thread, a.exc_value) for a in printed]
    assert steps(tmp_path / "fault")[:3] == [1, 2, 3]  # jsonl (first) is whole; the run stopped soon after


# ---------------------------------------------------------------- a row that fits in part: cut back out

@contextmanager
def file_size_limit(nbytes: int):
    """No file of this process may grow past `nbytes` (RLIMIT_FSIZE): the kernel writes up to the limit (a short
    write, like a disk that fills mid-row), then refuses with EFBIG (SIGXFSZ ignored so it is an error)."""
    resource = pytest.importorskip("resource")
    if not hasattr(signal, "SIGXFSZ"):
        pytest.skip("no SIGXFSZ")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and hard < nbytes:
        pytest.skip("the hard file size limit is lower")
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


ROWS = [{"step": 1, "loss": 2.0, "lr": 0.01}, {"step": 2, "loss": 1.5, "lr": 0.01}]
ROW3 = {"step": 3, "loss": 1.25, "lr": 0.01}


def test_jsonl_row_that_fits_in_part_is_cut_back_out(tmp_path):
    t = JsonlTracker(tmp_path)
    for r in ROWS:
        t.log(r)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    with file_size_limit(len(before) + 10), pytest.raises(UserError, match="metrics.jsonl"):
        t.log(ROW3)
    t.close()  # no second error over the same write
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


def test_csv_row_that_fits_in_part_is_cut_back_out(tmp_path):
    t = CsvTracker(tmp_path)
    for r in ROWS:
        t.log(r)
    before = (tmp_path / "metrics.csv").read_bytes()
    with file_size_limit(len(before) + 5), pytest.raises(UserError, match="metrics.csv"):
        t.log(ROW3)
    assert (tmp_path / "metrics.csv").read_bytes() == before
    t.log({"step": 4, "loss": 1.0, "lr": 0.01})  # room again: the file is rewritten with every row
    t.close()
    assert csv_steps(tmp_path) == [1, 2, 3, 4]


def test_csv_rewrite_that_does_not_fit_keeps_the_old_file(tmp_path):
    t = CsvTracker(tmp_path)
    for r in ROWS:
        t.log(r)
    before = (tmp_path / "metrics.csv").read_bytes()
    with file_size_limit(len(before) + 5), pytest.raises(UserError, match="metrics.csv"):
        t.log({**ROW3, "val_loss": 1.3})  # a new column: the whole file is rewritten (temp file, rename)
    t.close()
    assert (tmp_path / "metrics.csv").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]  # no temp file left taking the space


def test_csv_resume_leaves_out_a_line_cut_short(tmp_path):
    (tmp_path / "metrics.csv").write_text("step,loss\r\n1,2.0\r\n2,1.5\r\n3,1.2")  # a crash mid-line at step 3
    CsvTracker(tmp_path, start_step=3).close()
    assert csv_steps(tmp_path) == [1, 2]


# ---------------------------------------------------------------- the logger: a tracker of the user's

class Failing:
    def __init__(self, on: str, exc: BaseException):
        self.on, self.exc = on, exc

    def log(self, row):
        if self.on == "log":
            raise self.exc

    def close(self):
        if self.on == "close":
            raise self.exc


def test_user_tracker_write_error_is_a_user_error(tmp_path):
    logger = MetricsLogger(tmp_path, 4, trackers=[Failing("log", OSError(28, os.strerror(28)))])
    with pytest.raises(UserError, match="Failing.*No space left on device"):
        logger.log({"step": 1, "loss": 1.0})
    logger.close()


def test_close_does_not_raise_over_the_error_on_its_way(tmp_path):
    logger = MetricsLogger(tmp_path, 4, trackers=[Failing("close", OSError(28, os.strerror(28)))])
    with pytest.raises(UserError, match="the first error"):
        try:
            raise UserError("the first error")
        finally:
            logger.close()
    logger = MetricsLogger(tmp_path, 4, trackers=[Failing("close", OSError(28, os.strerror(28)))])
    with pytest.raises(UserError, match="cannot close Failing"):  # alone, the failure is said
        logger.close()


# ---------------------------------------------------------------- tune --budget-min

@pytest.mark.parametrize("budget", ["1e308", "10081", "inf", "nan", "-1"])
def test_tune_refuses_a_budget_beyond_a_week(budget, capsys, monkeypatch):
    import turbotrain.tune

    def run_tune(*a, **k):
        raise AssertionError(f"--budget-min {budget} was accepted")

    monkeypatch.setattr(turbotrain.tune, "run_tune", run_tune)
    assert main(["tune", str(USERPKG / "tune.toml"), "--budget-min", budget]) == 2
    line = error_line(capsys.readouterr().err)
    assert "--budget-min" in line and "10080" in line, line


def test_a_whole_run_file_that_meets_a_full_disk_is_one_error_and_the_old_file_stays(tmp_path):
    """config.toml, summary.json, report.md: written whole through a temp file; a full disk mid-write leaves
    the previous file as it was and no temp file, and says so in one UserError."""
    from turbotrain.rundir import write_run_file

    path = tmp_path / "summary.json"
    write_run_file(path, "old\n")
    with file_size_limit(4096), pytest.raises(UserError, match=r"cannot write .*summary\.json.*free space"):
        write_run_file(path, "x" * 100_000)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_the_monitor_closes_its_metrics_files_when_an_earlier_part_fails_to_close(tmp_path, monkeypatch):
    """A failure closing the alerts (an earlier part of RunMonitor.close) is raised, and metrics.jsonl is closed
    and whole all the same."""
    import torch

    from turbotrain.distributed.env import DistEnv
    from turbotrain.monitor.alerts import Alerts
    from turbotrain.monitor.run_monitor import RunMonitor, StepCost

    cost = StepCost(global_batch=8, tokens_per_sample=None, flops_per_sample=1.0, flops_source="test",
                    peak_flops=None)
    monitor = RunMonitor(tmp_path, DistEnv(), torch.device("cpu"), cost, steps=2, start_step=0, max_bad_steps=3,
                         straggler_ratio=0.0)
    monitor.logger.log(ROWS[0])

    def broken(self, wait_s=0.0):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Alerts, "close", broken)
    with pytest.raises(OSError, match="No space left"):
        monitor.close()
    assert monitor.logger.trackers == []  # every tracker closed
    assert rows(tmp_path) == [ROWS[0]]

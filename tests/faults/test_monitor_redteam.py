"""Red-team cases of watch, report and monitor.trackers: a dead run is never called running (the run directory's
lock decides, one verdict for both), a damaged or missing alerts.jsonl is never reported as "no alerts", and a
tracker entry that cannot work stops the run at the config load, before its directory is touched."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.report import load_run, render_markdown
from turbotrain.rundir import RunDir

BASE = str(BASE_TOML)
STOPPED = "stopped (no summary: crashed, killed or ended by an error)"


pytestmark = pytest.mark.usefixtures("userpkg_importable")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One finished 4-step run, copied per case."""
    out = tmp_path_factory.mktemp("finished")
    assert main(["train", BASE, f"run.out_dir={lit(out)}"]) == 0
    return out / "fault"


@pytest.fixture
def run_dir(tmp_path, finished) -> Path:
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    return d


class Held:
    """The run directory's lock held as a live run holds it (an exclusive flock on its own descriptor)."""

    def __init__(self, d: Path):
        self.fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def call(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def report_md(capsys, d: Path) -> str:
    rc, _, err = call(capsys, ["report", str(d)])
    assert rc == 0, err
    return (d / "report.md").read_text()


# ---------------------------------------------------------------- live or not: the lock decides

def test_lock_held_reads_the_lock_without_taking_or_making_it(tmp_path):
    assert RunDir.lock_held(tmp_path) is False and not (tmp_path / ".lock").exists()  # no lock: none made
    (tmp_path / ".lock").write_text("1 host\n")
    assert RunDir.lock_held(tmp_path) is False
    held = Held(tmp_path)
    try:
        assert RunDir.lock_held(tmp_path) is True
    finally:
        held.release()
    assert RunDir.lock_held(tmp_path) is False  # and the probe left no lock behind
    (tmp_path / ".lock").unlink()
    (tmp_path / ".lock").symlink_to(tmp_path / "elsewhere")
    assert RunDir.lock_held(tmp_path) is False  # a run never takes a linked lock
    (tmp_path / ".lock").unlink()
    os.mkfifo(tmp_path / ".lock")
    assert RunDir.lock_held(tmp_path) is not True  # answers (a FIFO's open does not hang); no run holds it


def test_a_run_stopped_by_nan_is_stopped_with_its_last_step(tmp_path, capsys):
    rc, _, _ = call(capsys, ["train", BASE, f"run.out_dir={lit(tmp_path)}",
                             'model.name="userpkg.models:nan_from_start"'])
    assert rc == 2
    d = tmp_path / "fault"
    assert not (d / "summary.json").exists() and (d / "metrics.jsonl").read_text()
    rc, out, _ = call(capsys, ["watch", str(d), "--once"])
    assert rc == 0 and f"[{STOPPED}]" in out and "running" not in out
    last = json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    assert f"step {last}   loss nan" in out  # the last row, NaN and all: not "step –"
    md = report_md(capsys, d)
    assert f"| state | {STOPPED} |" in md and f"| last step | {last} |" in md


def test_a_killed_run_is_stopped_and_a_live_one_running(run_dir, capsys):
    (run_dir / "summary.json").unlink()  # as kill -9 leaves it: rows, no summary, the lock dropped
    assert f"[{STOPPED}]" in call(capsys, ["watch", str(run_dir), "--once"])[1]
    held = Held(run_dir)
    try:
        assert "[running (last write" in call(capsys, ["watch", str(run_dir), "--once"])[1]
        assert "| state | running (last write" in report_md(capsys, run_dir)
    finally:
        held.release()


def test_watch_ends_after_one_frame_of_a_stopped_run(run_dir, capsys, monkeypatch):
    (run_dir / "summary.json").unlink()
    naps = []

    def nap(s):
        naps.append(s)
        assert len(naps) < 3, "watch keeps redrawing a run that stopped"

    monkeypatch.setattr("turbotrain.watch.time.sleep", nap)
    rc, out, _ = call(capsys, ["watch", str(run_dir), "--interval", "0.01"])
    assert rc == 0 and naps == [] and out.count("turbotrain watch —") == 1 and STOPPED in out


def test_watch_follows_a_live_run_until_it_stops(run_dir, capsys, monkeypatch):
    (run_dir / "summary.json").unlink()
    held, naps = Held(run_dir), []

    def nap(s):  # the run dies while watch waits for the next frame
        naps.append(s)
        held.release()
        assert len(naps) < 3, "watch keeps redrawing a run that stopped"

    monkeypatch.setattr("turbotrain.watch.time.sleep", nap)
    rc, out, _ = call(capsys, ["watch", str(run_dir), "--interval", "0.01"])
    frames = out.split("turbotrain watch —")[1:]
    assert rc == 0 and len(naps) == 1 and len(frames) == 2
    assert "[running" in frames[0] and f"[{STOPPED}]" in frames[1]


def test_a_summary_of_an_earlier_attempt_is_not_taken_for_the_end(run_dir, capsys):
    """A finished run resumed for more steps keeps its old summary.json until the new one is written: when the
    resumed attempt dies, the run stopped at its last row, it did not finish at the old summary's step."""
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 6, "loss": 0.5}) + "\n")
    rc, out, _ = call(capsys, ["watch", str(run_dir), "--once"])
    assert "[stopped (summary.json is of an earlier attempt, to step 4" in out and "step 6   loss 0.5" in out
    md = report_md(capsys, run_dir)
    assert "| state | stopped (summary.json is of an earlier attempt" in md and "| final loss | 0.5 |" in md


def test_a_lock_that_cannot_be_tested_gives_no_verdict(run_dir, capsys, monkeypatch):
    (run_dir / "summary.json").unlink()
    monkeypatch.setattr(RunDir, "lock_held", staticmethod(lambda path: None))
    out = call(capsys, ["watch", str(run_dir), "--once"])[1]
    assert "[not known whether it runs (no summary;" in out and "stopped" not in out and "[running" not in out


def test_a_finished_run_stays_finished(run_dir, capsys):
    rc, out, _ = call(capsys, ["watch", str(run_dir), "--interval", "0.01"])  # returns: no loop
    assert rc == 0 and "[finished]" in out and out.count("turbotrain watch —") == 1
    assert "| state | finished |" in report_md(capsys, run_dir)


# ---------------------------------------------------------------- alerts.jsonl that cannot be trusted

def _with_alerts(d: Path, counts: dict, lines: bytes | None) -> None:
    summary = json.loads((d / "summary.json").read_text())
    summary["alerts"] = counts
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "alerts.jsonl").unlink(missing_ok=True)
    if lines is not None:
        (d / "alerts.jsonl").write_bytes(lines)


ALERT = json.dumps({"time": 1.0, "step": 3, "rank": 0, "rule": "loss_spike", "value": 5.0, "threshold": 4.0,
                    "message": "loss 5 is 2.5x its running average 2"}).encode() + b"\n"


@pytest.mark.parametrize("counts, lines, says", [
    pytest.param({"loss_spike": 2}, b"\x00\xff\xfe junk\n", ["1 line of alerts.jsonl unreadable",
                 "summary.json counts 2 loss_spike alert(s) of which alerts.jsonl holds none"], id="damaged"),
    pytest.param({"data_wait": 1}, None, ["summary.json counts 1 data_wait alert(s) of which alerts.jsonl holds "
                                          "none"], id="removed"),
    pytest.param({}, b'{"step": 1, "rule": "x"\n[1, 2]\n{"step": "three", "rule": "y"}\n',
                 ["3 lines of alerts.jsonl unreadable"], id="damaged-no-counts"),
])
def test_alerts_that_were_lost_are_never_no_alerts(run_dir, capsys, counts, lines, says):
    _with_alerts(run_dir, counts, lines)
    md = report_md(capsys, run_dir)
    assert "No alerts." not in md and "## Alerts (0 readable, incomplete)" in md and "No alert could be read." in md
    out = call(capsys, ["watch", str(run_dir), "--once"])[1]
    assert "alerts (0 readable, incomplete):" in out and "  none" not in out
    for text in says:
        assert text in md and text in out


def test_readable_alerts_are_shown_beside_the_unreadable_count(run_dir, capsys):
    _with_alerts(run_dir, {"loss_spike": 1}, ALERT + b"\xff\xfe\n")
    md = report_md(capsys, run_dir)
    assert "## Alerts (1 readable, incomplete)" in md and "1 line of alerts.jsonl unreadable" in md
    assert "| 3 | 0 | loss_spike |" in md and "holds none" not in md


def test_repeats_held_back_are_not_a_disagreement(run_dir, capsys):
    _with_alerts(run_dir, {"loss_spike": 3}, ALERT)  # alert_repeat_s: 3 firings counted, the first one sent
    md = report_md(capsys, run_dir)
    assert "## Alerts (1)" in md and "Warning" not in md and "summary.json counts every firing: 3 loss_spike" in md
    assert "alerts (1):" in call(capsys, ["watch", str(run_dir), "--once"])[1]


def test_no_alerts_is_said_when_nothing_was_lost(run_dir, capsys):
    _with_alerts(run_dir, {}, None)
    assert "## Alerts (0)\n\nNo alerts." in report_md(capsys, run_dir)
    assert "alerts (0):\n  none" in call(capsys, ["watch", str(run_dir), "--once"])[1]


def test_a_line_being_written_by_a_live_run_is_not_damage(run_dir):
    (run_dir / "summary.json").unlink()
    (run_dir / "alerts.jsonl").write_bytes(ALERT + ALERT[:20])  # the writer is mid-line
    held = Held(run_dir)
    try:
        run = load_run(run_dir)
        assert run.state == "running" and run.alerts_unreadable == 0 and len(run.alerts) == 1
    finally:
        held.release()
    run = load_run(run_dir)  # the writer died mid-line: that alert is lost
    assert run.state == "stopped" and run.alerts_unreadable == 1
    assert "1 line of alerts.jsonl unreadable" in render_markdown(run, "report.png")


# ---------------------------------------------------------------- monitor.trackers before the run dir is touched

@pytest.mark.parametrize("trackers, expect", [
    pytest.param("[1]", ["monitor.trackers = [1]", "not a tracker name", "expected a list of strings"], id="int"),
    pytest.param('["csv", {a = 1}]', ["not a tracker name"], id="table"),
    pytest.param('["foo"]', ["unknown tracker 'foo'", "pkg.module:factory"], id="unknown"),
    pytest.param('["pkg.mod:"]', ["unknown tracker 'pkg.mod:'"], id="no-attribute"),
    pytest.param('["a b:c"]', ["unknown tracker 'a b:c'"], id="not-a-module-path"),
])
def test_a_bad_tracker_stops_before_the_run_dir_is_touched(run_dir, capsys, trackers, expect):
    before = sorted(p.name for p in run_dir.iterdir())
    rc, out, err = call(capsys, ["train", BASE, f"run.out_dir={lit(run_dir.parent)}", f"run.name={run_dir.name}",
                                 f"monitor.trackers={trackers}"])
    assert rc == 2
    line = error_line(err)
    for text in expect:
        assert text in line, line
    assert sorted(p.name for p in run_dir.iterdir()) == before  # the finished run was not set aside
    assert (run_dir / "summary.json").exists() and not (run_dir / "previous-1").exists()


def test_a_tracker_object_in_the_config_is_refused_before_the_run(tmp_path):
    """config.toml records tracker names: an object set from Python would be written as its repr, a config that
    no later load accepts."""
    from turbotrain.trainer import train

    class Mine:
        def log(self, row): ...

        def close(self): ...

    cases = ((["jsonl", "neptune"], "unknown tracker 'neptune'"), (["jsonl", Mine()], "not a tracker name"))
    for trackers, msg in cases:
        cfg = load_config(BASE, [f"run.out_dir={lit(tmp_path)}"])
        cfg.monitor.trackers = trackers
        with pytest.raises(UserError, match=msg):
            train(cfg)
        assert not (tmp_path / "fault").exists()


@pytest.mark.parametrize("extra", ["wandb", "mlflow"])
def test_a_missing_extra_is_for_the_training_machine_alone(monkeypatch, extra):
    monkeypatch.setitem(sys.modules, extra, None)  # as if not installed
    cfg = load_config(BASE, [f'monitor.trackers=["jsonl", "{extra}"]'])  # a run's config.toml loads anywhere
    with pytest.raises(UserError, match=f"names '{extra}' but {extra} is not installed: pip install {extra}"):
        cfg.monitor.check_sinks()


@pytest.mark.parametrize("spec, msg", [("userpkg.no_such_module:Make", "cannot import module 'userpkg.no_such_module'"),
                                       ("userpkg.models:no_such_factory", "has no attribute 'no_such_factory'")])
def test_a_tracker_factory_of_your_own_is_imported_before_the_run(spec, msg):
    cfg = load_config(BASE, [f'monitor.trackers=["{spec}"]'])
    with pytest.raises(UserError, match=msg):
        cfg.monitor.check_sinks()
    load_config(BASE, ['monitor.trackers=["csv", "userpkg.lead_s27:raising"]']).monitor.check_sinks()  # (run_dir, step)


def test_an_uninstalled_extra_leaves_a_finished_run_alone(run_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    rc, _, err = call(capsys, ["train", BASE, f"run.out_dir={lit(run_dir.parent)}", f"run.name={run_dir.name}",
                               'monitor.trackers=["wandb"]'])
    assert rc == 2 and "wandb is not installed" in error_line(err)
    assert (run_dir / "summary.json").exists() and not (run_dir / "previous-1").exists()


def test_good_tracker_lists_load():
    for trackers in ('["jsonl", "tensorboard", "csv"]', '["csv", "jsonl", "csv"]', '["userpkg.mod:Make"]', "[]"):
        load_config(BASE, [f"monitor.trackers={trackers}"])


def test_an_object_that_is_not_a_tracker_is_one_error(tmp_path):
    from turbotrain.monitor.logger import MetricsLogger

    with pytest.raises(UserError, match=r"monitor.trackers: 1 is not a tracker \(an object with log\(row\) and close"):
        MetricsLogger(tmp_path, 4, trackers=[1])

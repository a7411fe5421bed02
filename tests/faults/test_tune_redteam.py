"""Red team, `turbotrain tune`: SIGTERM/Ctrl-C leave no trial running and keep what was measured; speedups
compare like with like.

- SIGTERM to tune while a trial trains: the trial (its own process group) is killed and waited for, tune exits
  143 with one `error:` line, and tune.json/tune.md hold the trials so far, marked partial (no tuned.toml).
- A trial that starts its workers in sessions of their own (as torchrun does) is killed whole at its timeout.
- A signal after some trials finished: those trials, the best so far labelled as no recommendation.
- A baseline whose screening run was fast and whose re-runs were slow: it still reads 1.00x in the trials'
  table (its own screening run is the base there), and finalists compare medians with medians."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import USERPKG, userpkg_env
from turbotrain.cli import main
from turbotrain.tune import TrialRunner

TOML = str(USERPKG / "tune.toml")  # a residual MLP on items that sleep `data.args.delay` s each


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z, ...), None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")  # a zombie has ended; only its exit status waits to be read


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _sigterm_while_running(args: list[str], tmp_path: Path, children: int = 1, wait_s: float = 60):
    """`turbotrain ARGS` in a session of its own on the slow workload; once `children` processes run under it,
    SIGTERM to it alone (as `kill PID` does). (return code, stdout, stderr, the process tree seen before the
    signal); nothing is left running, whatever fails."""
    cmd = [sys.executable, "-m", "turbotrain", args[0], TOML, f"run.out_dir={str(tmp_path)!r}",
           "data.args.delay=0.05", *args[1:]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=userpkg_env(),
                            cwd=tmp_path, start_new_session=True)
    tree: list[int] = []
    try:
        deadline = time.monotonic() + wait_s
        while len(tree) < children and time.monotonic() < deadline and proc.poll() is None:
            tree = _descendants(proc.pid)
            time.sleep(0.2)
        assert len(tree) >= children, f"{args[0]}: {children} child process(es) did not start: {tree}"
        time.sleep(1.0)  # the children are past their start (interpreters up)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        return proc.returncode, out, err, tree
    finally:
        for pid in [proc.pid, *tree]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
def test_sigterm_kills_the_running_trial_and_writes_a_partial_report(tmp_path):
    # 32 items x 0.05 s a step: the input config's 40-step trial needs about a minute, so SIGTERM lands in it
    rc, out, err, tree = _sigterm_while_running(["tune", "--budget-min", "2"], tmp_path)
    assert rc == 128 + signal.SIGTERM, (rc, out[-2000:], err[-2000:])
    assert err.count("\n") == 1 and err.startswith("error: interrupted by SIGTERM"), err
    assert "rerun" in err and "tune.md" in err
    assert not [p for p in tree if _alive(p)]  # no trial outlives tune
    report = tmp_path / "tune-slow" / "tune"
    result = json.loads((report / "tune.json").read_text())
    assert result["partial"]["why"] == "interrupted by SIGTERM" and result["winner"] is None
    assert result["trials"][0]["status"] == "interrupted" and not (report / "tuned.toml").exists()
    assert "PARTIAL REPORT" in (report / "tune.md").read_text()
    assert not list(report.glob(".*.tmp"))  # every file written whole, no temporary left
    time.sleep(1.0)
    assert not list((report / "trials").glob("*/summary.json"))  # the trial did not go on to its end


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
def test_a_timed_out_trial_is_killed_with_the_workers_it_started_in_their_own_sessions(tmp_path):
    """torchrun starts each worker with start_new_session: killing the trial's process group alone left them."""
    from turbotrain.bench import run_until

    pid_file = tmp_path / "worker.pid"
    script = ("import subprocess, sys, time; "
              "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
              f"open({str(pid_file)!r}, 'w').write(str(w.pid)); time.sleep(120)")
    t0 = time.monotonic()
    worker = None
    try:
        rc = run_until([sys.executable, "-c", script], tmp_path / "log", "test", None, dict(os.environ), 3.0)
        worker = int(pid_file.read_text())
        assert rc == 124
        assert not _alive(worker), f"worker {worker} outlived its trial ({_state(worker)})"
        assert time.monotonic() - t0 < 30
    finally:
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def _stand_in(rates: dict[str, list[float]], stop_at: int | None = None):
    """A TrialRunner.__call__ that runs nothing: the n-th run of the input config ("input"), of the fused
    optimizer alone over it ("fused") or of any other configuration ("other") measures rates[key][n] (the
    last one from there on); the `stop_at`-th call sends this process SIGTERM, as `kill` would while that
    trial runs."""
    runs: dict[str, int] = {}
    total = [0]

    def call(self, name, changes, timeout_s, what, *a, **k):
        key = "input" if not changes else "fused" if changes == {"train.optimizer_impl": "fused"} else "other"
        n = runs[key] = runs.get(key, -1) + 1
        total[0] += 1
        if total[0] == stop_at:
            # a handler must be in place, or SIGTERM would end the test process itself
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), "tune handles no SIGTERM"
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the trial "runs" until the signal stops it
            raise AssertionError("SIGTERM did not stop the trial")
        rate = rates[key][min(n, len(rates[key]) - 1)]
        return {"status": "ok", "samples_per_s": rate, "samples_per_s_median_window": rate, "peak_mem_gib": 0.1,
                "compile_s": 0.0, "wall_s": 0.5, "device_name": "cpu", "global_batch": 32}

    return call


def test_a_signal_after_some_trials_keeps_them_in_a_partial_report(tmp_path, monkeypatch, capsys):
    """The third trial is stopped by SIGTERM: the two before it are in tune.json/tune.md with their speedups, the
    running one `interrupted`, the best so far named as no recommendation, no tuned.toml; exit 143, one line;
    the process's own handlers are back afterwards."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(TrialRunner, "__call__", _stand_in({"input": [100.0], "fused": [110.0], "other": [50.0]}, 3))
    rc = main(["tune", TOML, f"run.out_dir={str(tmp_path)!r}", "--budget-min", "5"])
    err = capsys.readouterr().err
    assert rc == 143 and err.count("\n") == 1 and err.startswith("error: interrupted by SIGTERM"), err
    assert "the 2 trial(s) finished so far" in err
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    report = tmp_path / "tune-slow" / "tune"
    result = json.loads((report / "tune.json").read_text())
    trials = [t for t in result["trials"] if t["status"] != "skipped"]
    assert [t["status"] for t in trials] == ["ok", "slower", "interrupted"], trials
    assert [t["speedup"] for t in trials[:2]] == [1.0, 0.5] and "speedup" not in trials[2]
    assert result["winner"] is None and not (report / "tuned.toml").exists()
    assert result["partial"]["best_so_far"]["id"] == "t00"
    table = (report / "tune.md").read_text()
    assert "PARTIAL REPORT" in table and "no recommendation" in table


def test_every_speedup_compares_like_with_like(tmp_path, monkeypatch):
    """The input config's screening run was fast (120) and its re-runs slow (90, 90), as a warming machine
    does: its row in the trials' table is still 1.00x (the base there is its own screening run), each trial is
    over that run, and each finalist's median over the input config's median; each table names its base."""
    rates = {"input": [120.0, 90.0, 90.0], "fused": [126.0, 99.0, 99.0], "other": [60.0]}
    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(rates))
    assert main(["tune", TOML, f"run.out_dir={str(tmp_path)!r}", "--budget-min", "5", "--repeats", "2"]) == 0
    report = tmp_path / "tune-slow" / "tune"
    result = json.loads((report / "tune.json").read_text())
    t00 = result["trials"][0]
    assert t00["speedup"] == 1.0 and result["baseline_samples_per_s"] == 120.0
    for t in result["trials"]:
        if t.get("samples_per_s"):
            assert t["speedup"] == pytest.approx(t["samples_per_s"] / 120.0), t
    fins = {f["label"]: f for f in result["finalists"]}
    assert fins["input config"]["speedup"] == 1.0 and result["baseline_median_samples_per_s"] == 90.0
    assert fins["fused optimizer"]["speedup"] == pytest.approx(99.0 / 90.0)
    assert result["winner"]["speedup"] == pytest.approx(99.0 / 90.0)
    table = (report / "tune.md").read_text()
    assert "| t00 | baseline | (input config) | 120.0 | 1.00 |" in table
    assert "x t00" in table and "over the input config's median" in table
    assert "1.10x the input config (finalists' medians)" in table


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
@pytest.mark.parametrize("args, children", [(["bench", "--variants", "baseline"], 1),
                                            (["scale", "--gpus", "1"], 2)],  # torchrun, its worker in its own session
                         ids=["bench", "scale"])
def test_sigterm_to_bench_or_scale_kills_every_child(tmp_path, args, children):
    """bench's variants and scale's torchrun run as process trees of their own, as tune's trials: SIGTERM leaves
    none running, and says so in one line."""
    rc, out, err, tree = _sigterm_while_running(args, tmp_path, children, wait_s=90)
    assert rc == 128 + signal.SIGTERM, (rc, out[-2000:], err[-2000:])
    assert err.count("\n") == 1 and err.startswith(f"error: interrupted by SIGTERM during {args[0]}"), err
    assert not [p for p in tree if _alive(p)], [(p, _state(p)) for p in tree]

"""No long phase is silent: a heartbeat says what runs every few seconds, with a child run's step and ETA."""
import json
import time

from turbotrain.log import Heartbeat, run_progress


def test_heartbeat_speaks_while_a_phase_runs_and_stops_after(capsys):
    with Heartbeat("compile: compiling", every=0.05, status=lambda: "detail"):
        time.sleep(0.3)
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "compile: compiling" in ln]
    assert len(lines) >= 2 and all("(detail)" in ln and " s" in ln for ln in lines)
    time.sleep(0.15)
    assert capsys.readouterr().out == ""  # stopped with the phase


def test_run_progress_reads_a_child_runs_step_and_eta(tmp_path):
    status = run_progress(tmp_path, 100)
    assert status() == "starting"
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    assert status() == "step 1/100"
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 20}) + "\n")
    assert status().startswith("step 20/100, ETA ")


def test_plain_progress_lines_carry_an_eta_from_the_second_step(tmp_path, capsys, monkeypatch):
    """In a log file (no terminal) progress lines come at log steps and, between them, every 10 s; the ETA
    appears as soon as two steps are done."""
    import turbotrain.monitor.logger as logger_mod

    monkeypatch.setattr(logger_mod.sys.stdout, "isatty", lambda: False, raising=False)
    log = logger_mod.MetricsLogger(tmp_path, total_steps=100, trackers=["jsonl"])
    assert log.eta(1) == "-:--:--" and log.eta(2) != "-:--:--"
    log.last_line -= 11  # 11 s without a line
    log.tick(5)
    log.close()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("step 5/100 | ETA ")

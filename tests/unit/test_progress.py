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

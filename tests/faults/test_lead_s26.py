"""The lead's fixes of session 26: one test per class."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.faults.common import BASE_TOML, lit
from turbotrain.cli import main

pytestmark = pytest.mark.usefixtures("userpkg_importable")


def test_a_leak_in_a_process_that_held_more_before_the_run_reads_as_growth(tmp_path, capsys):
    """A process that once held more than it does now (a notebook, a data load since freed, a long test session):
    the CPU's peak memory is the peak RSS since the run's setup, so a leak under the process's earlier peak still
    rises at every log step, and a leak of a few hundred MiB clears the 5 % bar however much the process holds."""
    held = np.ones(2**27)  # 1 GiB, every page written, then freed
    del held
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.steps=30",
               "train.callbacks=['userpkg.planted_s25b_monitor:Leak']"])
    assert rc == 0
    rows = [json.loads(ln) for ln in (tmp_path / "fault" / "metrics.jsonl").read_text().splitlines()]
    peaks = [r["peak_mem_gib"] for r in rows if "peak_mem_gib" in r]
    assert peaks == sorted(peaks) and peaks[-1] - peaks[0] > 0.2, peaks  # 16 MiB a step
    alerts = [json.loads(ln) for ln in (tmp_path / "fault" / "alerts.jsonl").read_text().splitlines()]
    assert [a["rule"] for a in alerts].count("memory_growth") == 1, alerts
    assert "alert memory_growth" in capsys.readouterr().out

"""Planted cases for `turbotrain tune` (wave 9): tuned.toml that trains what was measured, and a one-run gain
inside the run's own noise.

- The command line replaces a table the input file sets (model.args.table={y=2} over the file's {x=1, z=3}): the
  trials ran with {y=2}, but `extends` merges tables key by key, so a tuned.toml of the overrides alone trained
  {x=1, z=3, y=2}, a model that was never measured. Odd values (quotes, backslashes, a dotted key) read back as given.
- Measured once (--repeats 0, or no budget left for the finalists' re-runs), a gain smaller than the swing of the
  runs' own log windows is not told apart from noise: the input config is kept. A gain far beyond it still wins,
  and the warm-up window (a compile) is no swing.
- A candidate whose run trained another global batch changed the math: its samples/s is no speed-up.
- A finalist whose re-run ran out of memory fails runs of the configuration it would recommend: not the winner.
- Trials run where the run folder's name holds a character past U+FFFF (one real 4-step trial).

The trials here are measured figures given by a stand-in for the trial process (as test_planted_s25_tune does):
what is under test is what tune decides and writes from them."""
from __future__ import annotations

import json

import pytest

from tests.faults.common import BASE_TOML, lit
from tests.faults.test_planted_s25_tune import _stand_in, _windows
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.tune import TrialRunner

pytestmark = pytest.mark.usefixtures("userpkg_importable")

NOTED = 'model.name="userpkg.planted_s26_tune:noted"'
ODD = r'"a \"quoted\" \\ back\\slash' + "'s" + '"'  # TOML basic string: quotes, a backslash, an apostrophe


def _fused_wins(changes, n):
    return 200.0 if changes.get("train.optimizer_impl") == "fused" else 100.0


def _tuned(tmp_path, config, *overrides):
    assert main(["tune", str(config), f"run.out_dir={lit(tmp_path)}", *overrides, "--budget-min", "5",
                 "--repeats", "1"]) == 0
    tuned = next(tmp_path.glob("*/tune/tuned.toml"))
    return tuned, tuned.read_text()


def test_a_table_the_command_line_replaces_stays_replaced_in_tuned_toml(tmp_path, monkeypatch):
    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(_fused_wins))
    config = tmp_path / "in.toml"
    config.write_text(f'extends = "{BASE_TOML}"\n[model]\nname = "userpkg.planted_s26_tune:noted"\n'
                      "[model.args]\ndim = 8\ntable = {x = 1, z = 3}\n")
    overrides = ['model.args.table={y = 2, "a.b" = "s"}', f"model.args.note={ODD}"]
    tuned, text = _tuned(tmp_path, config, *overrides)
    measured = load_config(str(config), [*overrides, 'train.optimizer_impl="fused"'])
    got = load_config(str(tuned))
    assert got.model.args == measured.model.args == {"dim": 8, "table": {"y": 2, "a.b": "s"},
                                                     "note": 'a "quoted" \\ back\\slash\'s'}
    assert got.train == measured.train and got.run.name == "in-tuned"
    assert "train.optimizer_impl" in text and "fused optimizer: 2.00x" in text  # the change and its effect stay said


def test_tuned_toml_extends_the_input_where_that_reads_back_the_same(tmp_path, monkeypatch):
    """Keys the command line adds inside a table merge as extends does: tuned.toml stays the short file."""
    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(_fused_wins))
    overrides = [NOTED, f"model.args.note={ODD}", "model.args.table.y=2"]
    tuned, text = _tuned(tmp_path, BASE_TOML, *overrides)
    assert text.count("\n[") <= 6 and f'extends = "{BASE_TOML}"' in text
    got, measured = load_config(str(tuned)), load_config(str(BASE_TOML), [*overrides, 'train.optimizer_impl="fused"'])
    assert got.model == measured.model and got.train.optimizer_impl == "fused"


BUSY = (1.0, 0.7, 1.3, 1.0)  # a busy machine: the steady windows swing +-30 % (spread 60 %)
WARM = (0.1, 1.0, 1.02, 0.98)  # a quiet one: the first window holds the warm-up (a compile), 10x slower


@pytest.mark.parametrize("gain, windows, kept", [(1.15, BUSY, False), (3.0, BUSY, True), (1.5, WARM, True)])
def test_a_gain_measured_once_inside_the_runs_window_swing_is_noise(tmp_path, monkeypatch, gain, windows, kept):
    """--repeats 0 leaves one run each. On a busy machine the fused optimizer's one run 15 % faster is inside the
    swing of the runs' own log windows: not a win (the input config is kept, and tune says why); 3x is far beyond
    it. The warm-up window is no swing (the timed samples/s leaves it out): 1.5x on a quiet machine wins."""
    def rate(changes, n):
        return 100.0 * (gain if changes == {"train.optimizer_impl": "fused"} else 0.5 if changes else 1.0)

    monkeypatch.setattr(TrialRunner, "__call__", _windows(rate, windows, global_batch=8))
    assert main(["tune", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "--budget-min", "5", "--repeats", "0"]) == 0
    out = tmp_path / "fault" / "tune"
    result, toml = json.loads((out / "tune.json").read_text()), (out / "tuned.toml").read_text()
    assert result["winner"]["changes"] == ({"train.optimizer_impl": "fused"} if kept else {})
    assert ("optimizer_impl" in toml) == kept
    assert "measured once" in result["noise"]
    if not kept:
        assert "60% its runs' own log windows swing" in result["noise"] and "not told apart from noise" in toml


def test_a_candidate_that_trained_another_global_batch_is_no_win(tmp_path, monkeypatch):
    """The fused optimizer's run reports 4x the samples a step (global batch 64, the input's 16): its 4x samples/s
    is another math, not a speed-up. It is recorded as an error saying so and does not reach tuned.toml."""
    step = _stand_in(_fused_wins)

    def call(self, name, changes, *a, **k):
        out = step(self, name, changes, *a, **k)
        return {**out, "global_batch": 64} if changes.get("train.optimizer_impl") == "fused" else out

    monkeypatch.setattr(TrialRunner, "__call__", call)
    assert main(["tune", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "--budget-min", "5", "--repeats", "1"]) == 0
    out = tmp_path / "fault" / "tune"
    result = json.loads((out / "tune.json").read_text())
    fused = next(t for t in result["trials"] if t["tried"] == {"train.optimizer_impl": "fused"})
    assert fused["status"] == "error" and "changed the math: global batch 64, the input config's 16" in fused["reason"]
    assert result["winner"]["changes"] == {} and "optimizer_impl" not in (out / "tuned.toml").read_text()


def test_a_trial_runs_where_the_run_folder_holds_a_character_past_u_ffff(tmp_path, monkeypatch):
    """A real trial (a `turbotrain train` process, 4 steps) under an out_dir named with U+20000 (a CJK letter, valid
    in paths and run names): its run.out_dir override must be TOML the trial reads. JSON escaped it as a surrogate
    pair, which TOML refuses: every trial, the input config's first, failed and tune said "fix the config"."""
    from tests.helpers import userpkg_env

    monkeypatch.setenv("PYTHONPATH", userpkg_env()["PYTHONPATH"])  # the trial process imports userpkg
    runner = TrialRunner(str(BASE_TOML), [], tmp_path / "u\U00020000" / "tune")
    res = runner("t00-input-config", {"train.optimizer_impl": "foreach"}, 120, "test trial", steps=4)
    assert res["status"] == "ok", res


def test_a_finalist_whose_re_run_fails_is_no_recommendation(tmp_path, monkeypatch, capsys):
    """The fused optimizer screens 2x the input config, then its first re-run runs out of memory (at the edge of
    memory, it fails some runs) and its second is 2x again. Its runs that worked beat the input in every round, but
    a configuration that fails runs is not the one to train with: the input config is kept, and the failure is
    said (tune.md's finalists, the noise note, tuned.toml's head)."""
    def rate(changes, n):
        if changes == {"train.optimizer_impl": "fused"}:
            return None if n == 1 else 200.0
        return 100.0 if not changes else 50.0

    step = _stand_in(rate)

    def call(self, *a, **k):
        out = step(self, *a, **k)
        return {**out, "status": "oom", "reason": "exit 1: CUDA out of memory"} if out["status"] == "error" else out

    monkeypatch.setattr(TrialRunner, "__call__", call)
    assert main(["tune", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "--budget-min", "5", "--repeats", "2"]) == 0
    out = tmp_path / "fault" / "tune"
    result, md = json.loads((out / "tune.json").read_text()), (out / "tune.md").read_text()
    assert result["winner"]["changes"] == {} and "optimizer_impl" not in (out / "tuned.toml").read_text()
    assert "fused optimizer failed re-run 1: oom (exit 1: CUDA out of memory): not a recommendation" in result["noise"]
    assert "re-run 1: oom" in md and "not a recommendation" in (out / "tuned.toml").read_text().splitlines()[1]

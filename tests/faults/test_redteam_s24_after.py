"""Red-team cases of what users do with a finished or failed run: `turbotrain.load`, `export`, `report` and `watch`
on a finished run resumed past its end that then stopped (its final/ is the earlier end's model, not the run's
latest), on a run that saved no model at all, and on a folder inside a run named in place of the run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import turbotrain
from tests.faults.common import BASE_TOML, CrashAt, error_line, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.errors import UserError

pytestmark = pytest.mark.usefixtures("userpkg_importable")


def _train(out: Path, *overrides: str, crash: int | None = None) -> Path:
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(out)}", *overrides])
    try:
        turbotrain.train(cfg, callbacks=[CrashAt(crash)] if crash else [])
    except UserError as e:
        assert crash and "crash for the test" in str(e), e
    return out / "fault"


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _checkpoint_model(run: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / f"step-{step:08d}" / "state.pt", weights_only=True)["model"]


def _same(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    got = model.state_dict()
    return got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)


# ---------------------------------------------------------------- a finished run resumed past its end, then stopped

@pytest.fixture(scope="module")
def extended(tmp_path_factory) -> Path:
    """Finished at step 4 (final/ of step 4), resumed with train.steps=8 and crashed at step 7: checkpoints at
    2, 4 and 6, the earlier summary set aside, final/ still the step-4 model."""
    import sys

    from tests.helpers import TESTS

    sys.path.insert(0, str(TESTS))
    try:
        out = tmp_path_factory.mktemp("extended")
        run = _train(out, "checkpoint.every=2")
        _train(out, "checkpoint.every=2", "train.steps=8", crash=7)
        return run
    finally:
        sys.path.remove(str(TESTS))


@pytest.fixture
def run(extended, tmp_path) -> Path:
    return Path(shutil.copytree(extended, tmp_path / "run"))


def test_load_of_an_extended_run_that_stopped_does_not_hand_out_the_earlier_end(run):
    """load() gave the step-4 model of final/ as the run's trained model, silently: the run had trained to
    step 6 (report and watch say so) and its checkpoint holds that model."""
    assert (run / "final").is_dir() and (run / "checkpoints" / "step-00000006").is_dir()
    with pytest.raises(UserError) as e:
        turbotrain.load(run, "cpu")
    line = str(e.value)
    assert "step 4" in line and "step 6" in line and "turbotrain export" in line and str(run / "final") in line, line
    earlier = turbotrain.load(run / "final", "cpu")  # named, the earlier end's model is still there to load
    assert not _same(earlier, _checkpoint_model(run, 6))


def test_export_of_an_extended_run_that_stopped_is_its_latest_model_and_keeps_the_earlier_end(run, capsys):
    """export copied final/ (step 4) out as the run's model; now it writes final/ from checkpoint step 6 and
    keeps the earlier final/ whole beside it, so nothing is lost and load() gives the latest."""
    earlier = (run / "final" / "model.safetensors").read_bytes()
    rc, out, err = _cli(capsys, "export", str(run), "--format", "safetensors")
    assert rc == 0 and not err.strip(), err
    assert "final.step-00000004" in out, out
    assert (run / "final.step-00000004" / "model.safetensors").read_bytes() == earlier
    want = _checkpoint_model(run, 6)
    assert _same(turbotrain.load(run, "cpu"), want)
    assert _same(turbotrain.load(run / "export" / "safetensors", "cpu"), want)
    rc, _, err = _cli(capsys, "export", str(run), "--format", "safetensors")  # again: nothing more set aside
    assert rc == 0 and sorted(p.name for p in run.glob("final*")) == ["final", "final.step-00000004"], err


def test_a_finished_run_is_still_loaded_from_its_final_folder(tmp_path, capsys):
    """The check looks only past final/'s own step: a finished run with checkpoints up to its end is untouched."""
    run = _train(tmp_path, "checkpoint.every=2")
    before = (run / "final" / "model.safetensors").read_bytes()
    assert _same(turbotrain.load(run, "cpu"), _checkpoint_model(run, 4))
    rc, out, err = _cli(capsys, "export", str(run), "--format", "safetensors")
    assert rc == 0 and "checkpoint" not in out and (run / "final" / "model.safetensors").read_bytes() == before


# ---------------------------------------------------------------- a run that saved no model

def test_a_run_that_saved_no_model_is_not_sent_to_export_it(tmp_path, capsys):
    """Stopped before its end with checkpoint.every = 0: load() told the user to run `turbotrain export`, which
    then failed with "no good checkpoint", a fix that cannot work."""
    run = _train(tmp_path, crash=2)
    assert not (run / "final").exists() and not (run / "checkpoints").exists()
    with pytest.raises(UserError) as e:
        turbotrain.load(run, "cpu")
    assert "no checkpoint" in str(e.value) and "train it again" in str(e.value), e.value
    assert "turbotrain export" not in str(e.value)
    rc, _, err = _cli(capsys, "export", str(run), "--format", "safetensors")
    line = error_line(err)
    assert rc == 2 and "no checkpoint" in line and "train it again" in line, line


# ---------------------------------------------------------------- a folder inside a run named for the run

INSIDE = {"final": "final", "checkpoint": "checkpoints/step-00000004", "metrics-file": "metrics.jsonl",
          "an-export": "export/safetensors"}


@pytest.mark.parametrize("command", [["report"], ["watch", "--once"]])
@pytest.mark.parametrize("inside", INSIDE.values(), ids=INSIDE.keys())
def test_report_and_watch_of_a_folder_inside_a_run_name_the_run(extended, tmp_path, capsys, command, inside):
    """`report RUN/final` said "the run logged no step ... train it again" of a finished run; `watch
    RUN/metrics.jsonl` said "no metrics.jsonl"."""
    run = Path(shutil.copytree(extended, tmp_path / "run"))
    (run / "export" / "safetensors").mkdir(parents=True)
    shutil.copy(run / "final" / "model.safetensors", run / "export" / "safetensors")
    shutil.copy(run / "final" / "config.toml", run / "export" / "safetensors")
    rc, _, err = _cli(capsys, *command, str(run / inside))
    line = error_line(err)
    assert rc == 2 and f"name the run: {run}" in line and "train it again" not in line, line
    assert not (run / inside / "report.md").exists()


def test_export_of_a_checkpoint_folder_names_the_run(extended, capsys):
    rc, _, err = _cli(capsys, "export", str(extended / "checkpoints" / "step-00000004"), "--format", "safetensors")
    line = error_line(err)
    assert rc == 2 and f"name the run: {extended}" in line, line


@pytest.mark.parametrize("command", [["report"], ["watch", "--once"]])
def test_report_and_watch_expand_the_home_folder_and_name_a_missing_run(extended, tmp_path, capsys, monkeypatch,
                                                                      command):
    """The Python API and a quoted "~/runs/x" were read as a folder named "~"; a path that names nothing was
    "no metrics.jsonl; expected a run directory"."""
    run = Path(shutil.copytree(extended, tmp_path / "home" / "runs" / "x"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    rc, out, err = _cli(capsys, *command, "~/runs/x")
    assert rc == 0 and not err, err
    said = out if command[0] == "watch" else (run / "report.md").read_text()
    assert str(run) in out and ("step 6 " in said or "| last step | 6 |" in said), said
    rc, _, err = _cli(capsys, *command, str(tmp_path / "nothing"))
    line = error_line(err)
    assert rc == 2 and "no such run directory" in line, line


# ---------------------------------------------------------------- what report and watch say of the run

def _report_md(capsys, run: Path) -> str:
    rc, _, err = _cli(capsys, "report", str(run))
    assert rc == 0 and not err, err
    return (run / "report.md").read_text()


def _watch(capsys, run: Path) -> str:
    rc, out, err = _cli(capsys, "watch", "--once", str(run))
    assert rc == 0 and not err, err
    return out


def test_report_gives_a_stopped_runs_last_evaluation_with_its_step(run, capsys):
    """report said "val loss –" (as if no evaluation ran) for a run without a summary of this attempt, while
    watch showed the step-4 evaluation as the current one; both now give it with its step."""
    evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "val_loss" in r]
    want = f"{evals[-1]['val_loss']:.4g} (at step {evals[-1]['step']})"
    assert evals[-1]["step"] == 4
    assert f"| val loss | {want} |" in _report_md(capsys, run)
    assert f"val_loss {want}" in _watch(capsys, run)


def test_report_says_a_diverged_last_evaluation_not_none(tmp_path, capsys):
    """The summary's val_loss is null when the last evaluation was NaN: report wrote "–", as if none ran."""
    run = _train(tmp_path, 'model.name="userpkg.redteam2:eval_nan"', "model.args={}", "train.eval_every=2")
    assert json.loads((run / "summary.json").read_text())["val_loss"] is None
    assert "| val loss | null (NaN/inf: the last evaluation diverged) |" in _report_md(capsys, run)


def test_report_and_watch_say_the_steps_fp16_skipped(tmp_path, capsys):
    """An fp16 run whose loss scaling skipped most optimizer steps read as an ordinary finished run in both."""
    run = _train(tmp_path, "precision.dtype=fp16")
    n = json.loads((run / "summary.json").read_text())["skipped_steps"]
    assert n > 0
    assert f"| optimizer steps skipped (fp16) | {n} of 4 (" in _report_md(capsys, run)
    assert f"optimizer steps skipped: {n} of 4 (" in _watch(capsys, run)


@pytest.mark.parametrize("command", [["report"], ["watch", "--once"]])
def test_a_finished_run_that_lost_its_metrics_file_is_not_told_to_train_again(extended, tmp_path, capsys, command):
    """metrics.jsonl deleted from a run with a summary: "the run logged no step ... train it again"."""
    run = Path(shutil.copytree(extended, tmp_path / "run"))
    shutil.copy(run / "summary.step-00000004.json", run / "summary.json")
    (run / "metrics.jsonl").unlink()
    rc, _, err = _cli(capsys, *command, str(run))
    line = error_line(err)
    assert rc == 2 and "metrics.jsonl is missing" in line and "train it again" not in line, line

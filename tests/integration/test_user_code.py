"""Black-box: user code that lives outside turbotrain (tests/userpkg) trains through the CLI
and through the Python API — `pkg.module:factory` models and datasets, a `pkg.module:fn` loss, a model
that returns its own loss — and the run directory holds what the contract promises."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import USERPKG, userpkg_env

STEPS = 40
ROW_KEYS = ("step", "loss", "lr", "samples_per_s", "step_ms", "data_wait_pct", "mfu", "peak_mem_gib")


def out_dir(tmp_path: Path) -> str:
    return f"run.out_dir={str(tmp_path)!r}"  # a TOML literal string


def run_cli(toml: Path, tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = userpkg_env()
    argv = [sys.executable, "-m", "turbotrain", "train", str(toml), out_dir(tmp_path), f"train.steps={STEPS}",
            "train.log_every=1", "precision.dtype=fp32", *overrides]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)


def check_run_dir(run_dir: Path, name: str) -> list[dict]:
    """config.toml / metrics.jsonl / summary.json exist and are well formed; returns the metrics rows."""
    for f in ("config.toml", "metrics.jsonl", "summary.json"):
        assert (run_dir / f).is_file(), f"{f} missing in {run_dir}: {sorted(p.name for p in run_dir.iterdir())}"
    resolved = tomllib.loads((run_dir / "config.toml").read_text())
    assert resolved["model"]["name"] == f"userpkg.{name}:build"
    assert resolved["train"]["steps"] == STEPS
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == STEPS, f"log_every=1 over {STEPS} steps should log {STEPS} rows, got {len(rows)}"
    for row in rows:
        missing = [k for k in ROW_KEYS if k not in row]
        assert not missing, f"metrics row lacks {missing}: {row}"
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert summary["final_loss"] == pytest.approx(rows[-1]["loss"])
    return rows


def assert_loss_falls(losses: list[float]) -> None:
    tail = sum(losses[-5:]) / 5
    assert tail < 0.7 * losses[0], f"loss did not fall: first {losses[0]:.4f}, mean of last 5 {tail:.4f}; {losses}"


# ---------------------------------------------------------------- through the CLI

@pytest.mark.parametrize("name", ["charlm", "regression"])
def test_cli_trains_user_model_and_data(tmp_path, name):
    r = run_cli(USERPKG / f"{name}.toml", tmp_path)
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    rows = check_run_dir(tmp_path / name, name)
    assert_loss_falls([row["loss"] for row in rows])
    if name == "charlm":  # integer (B, T) inputs are tokens: the last row carries eval and token rate
        assert rows[-1].get("tokens_per_s", 0) > 0
        assert "val_loss" in rows[-1]


def test_cli_user_loss_function(tmp_path):
    r = run_cli(USERPKG / "regression.toml", tmp_path, 'train.loss="userpkg.regression:huber"')
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    rows = check_run_dir(tmp_path / "regression", "regression")
    assert tomllib.loads((tmp_path / "regression" / "config.toml").read_text())["train"]["loss"] == \
        "userpkg.regression:huber"
    assert_loss_falls([row["loss"] for row in rows])


def test_cli_user_code_not_on_path_is_a_user_error(tmp_path):
    """Without userpkg on PYTHONPATH the CLI says so in one line, no traceback."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "turbotrain", "train", str(USERPKG / "regression.toml"),
                        out_dir(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error:") and "userpkg" in lines[0], r.stderr


# ---------------------------------------------------------------- through the Python API

@pytest.fixture
def api():
    from turbotrain import load_config, train

    return load_config, train


@pytest.mark.parametrize("loss, model", [
    ("userpkg.regression:huber", "userpkg.regression:build"),
    ("model", "userpkg.regression:build_with_loss"),  # forward(x, y) returns the loss
], ids=["loss-fn", "model-returns-loss"])
def test_api_custom_loss(tmp_path, api, loss, model):
    load_config, train = api
    cfg = load_config(str(USERPKG / "regression.toml"), [
        out_dir(tmp_path), f"train.steps={STEPS}", "train.log_every=1", "precision.dtype=fp32",
        f"train.loss={loss!r}", f"model.name={model!r}"])
    assert cfg.train.loss == loss and cfg.model.name == model
    summary = train(cfg)
    run_dir = tmp_path / "regression"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == STEPS and all(all(k in r for k in ROW_KEYS) for r in rows)
    assert (run_dir / "config.toml").is_file() and (run_dir / "summary.json").is_file()
    assert summary["steps"] == STEPS
    assert summary["final_loss"] == pytest.approx(rows[-1]["loss"])
    assert json.loads((run_dir / "summary.json").read_text())["final_loss"] == pytest.approx(summary["final_loss"])
    assert_loss_falls([r["loss"] for r in rows])
    # the end-of-run eval goes through the same loss path (the model's own loss for "model")
    assert summary["val_loss"] is not None and summary["val_loss"] < 0.7 * rows[0]["loss"]


def test_api_extends_preset_with_user_model_and_data(tmp_path, api):
    """A TOML that starts from a preset (`extends = "mlp-seed"`) and swaps in user code: the preset's
    keys the TOML does not set are kept, and the preset's args for its *own* MLP model / synthetic data
    must not be passed to the user's factories (they take different arguments)."""
    load_config, train = api
    toml = tmp_path / "extends.toml"
    toml.write_text(
        'extends = "mlp-seed"\n'
        '[run]\nname = "ext"\n'
        '[model]\nname = "userpkg.regression:build"\n[model.args]\ndim = 8\n'
        '[data]\nname = "userpkg.regression:dataset"\nbatch_size = 32\nnum_workers = 0\n[data.args]\nn = 256\ndim = 8\n'
        '[train]\nloss = "mse"\nlr = 0.1\nwarmup_steps = 0\nweight_decay = 0.0\n')
    cfg = load_config(str(toml), [out_dir(tmp_path), "train.steps=20", "train.log_every=1", "precision.dtype=fp32"])
    assert cfg.data.eval_batches == 4  # from the preset
    assert cfg.run.name == "ext" and cfg.train.lr == 0.1  # from the TOML
    summary = train(cfg)
    assert summary["steps"] == 20
    assert (tmp_path / "ext" / "summary.json").is_file()

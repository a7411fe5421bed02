"""A model you can use: every finished run has final/ (without periodic checkpoints), turbotrain.load(run)
reproduces the run's val loss from the run directory alone, tied weights are stored once and tied again,
`turbotrain export` writes safetensors (from a checkpoint when the run did not finish) and refuses hf for a
non-HF model with one line."""
from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from safetensors import safe_open

from turbotrain import load, train
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.data.loader import build_dataset, eval_batches
from turbotrain.errors import UserError
from turbotrain.export import export
from turbotrain.losses import cross_entropy

TINY = ["model.args.n_layer=1", "model.args.n_head=2", "model.args.n_embd=32", "data.args.block_size=32",
        "data.batch_size=8", "data.eval_batches=3", "train.steps=3", "train.log_every=1", "train.eval_every=0",
        'precision.dtype="fp32"']


def tiny(tmp_path, *overrides):
    """The default preset (gpt-shakespeare), shrunk."""
    return load_config(None, [*TINY, f"run.out_dir={str(tmp_path / 'runs')!r}", *overrides])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    path = tmp_path_factory.mktemp("export")
    cfg = tiny(path)
    assert cfg.checkpoint.every == 0  # the default preset checkpoints nothing
    summary = train(cfg)
    return path / "runs" / cfg.run.name, summary


def test_final_exists_and_load_reproduces_val_loss_from_the_run_dir_alone(finished, tmp_path, monkeypatch):
    run_dir, summary = finished
    assert sorted(p.name for p in (run_dir / "final").iterdir()) == ["config.toml", "final.json", "model.safetensors"]
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    cfg = load_config(str(run_dir / "final" / "config.toml"))
    val = build_dataset(cfg.data, "val")
    # the run directory alone: a copy elsewhere, no dataset cache to take the vocabulary from
    copy = shutil.copytree(run_dir, tmp_path / "copy")
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "empty-cache"))
    model = load(copy, "cpu")
    assert not model.training
    batches = eval_batches(val, cfg.data.batch_size, cfg.data.eval_batches, 0, 1)
    with torch.no_grad():
        vals = [cross_entropy(model(x), y).item() for x, y in (val.gather(i) for i in batches)]
    assert sum(vals) / len(vals) == pytest.approx(summary["val_loss"], abs=1e-5)


def test_tied_weights_are_stored_once_and_tied_again(finished):
    run_dir, _ = finished
    with safe_open(str(run_dir / "final" / "model.safetensors"), "pt") as f:
        tied = json.loads(f.metadata()["tied"])
        assert tied == {"head.weight": "wte.weight"} and "head.weight" not in f.keys()
    model = load(run_dir, "cpu")
    assert model.head.weight is model.wte.weight


def test_export_cli_safetensors_and_hf_refused_for_a_builtin_model(finished, tmp_path, capsys, monkeypatch):
    run_dir, _ = finished
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the current directory first
    assert main(["export", str(run_dir), "--format", "safetensors", "--out", str(tmp_path / "st")]) == 0
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["config.toml", "final.json", "model.safetensors"]
    capsys.readouterr()
    assert main(["export", str(run_dir), "--format", "hf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "use --format safetensors" in err, err
    assert main(["export", str(run_dir), "--format", "onnx"]) == 2
    with pytest.raises(UserError, match="no such run directory"):
        export(tmp_path / "nope", "safetensors")


def test_unfinished_run_exports_from_its_checkpoint(tmp_path):
    cfg = tiny(tmp_path, "run.name=ck", "checkpoint.every=2", "train.steps=4")
    train(cfg)
    run_dir = tmp_path / "runs" / "ck"
    x = torch.randint(0, 60, (2, 16))
    with torch.no_grad():
        want = load(run_dir, "cpu")(x)
    shutil.rmtree(run_dir / "final")  # as if the run had been stopped after its last checkpoint
    with pytest.raises(UserError, match="did not finish"):
        load(run_dir)
    export(run_dir, "safetensors")
    with torch.no_grad():
        torch.testing.assert_close(load(run_dir, "cpu")(x), want, rtol=0, atol=0)

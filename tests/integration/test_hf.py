"""Hugging Face models through turbotrain: `hf:gpt2` from config keywords (no download) trains on Shakespeare
with its own loss and with cross_entropy alike, under 1 process and 2 gloo ranks (DDP, FSDP2); `hf:/dir`
loads saved weights; a user factory's bare HF model is adapted; its blocks are found; export --format hf
loads with from_pretrained and gives turbotrain.load's logits; dict rows train; errors are one line."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from tests.helpers import run_bounded, userpkg_env  # noqa: E402
from turbotrain import load, train  # noqa: E402
from turbotrain.config import load_config  # noqa: E402
from turbotrain.errors import UserError  # noqa: E402
from turbotrain.models import ModelConfig, build_model  # noqa: E402
from turbotrain.models.structure import find_blocks  # noqa: E402

TOML = """
[run]
name = "hf"
[model]
name = "hf:gpt2"
[model.args]
n_layer = 2
n_head = 2
n_embd = 32
n_positions = 64
resid_pdrop = 0.0
embd_pdrop = 0.0
attn_pdrop = 0.0
[data]
name = "shakespeare"
batch_size = 8
eval_batches = 2
[data.args]
block_size = 32
[train]
steps = 4
lr = 3e-3
log_every = 1
[precision]
dtype = "fp32"
"""


def hf_config(tmp_path: Path, *overrides: str):
    toml = tmp_path / "hf.toml"
    toml.write_text(TOML)
    return load_config(str(toml), [f"run.out_dir={str(tmp_path / 'runs')!r}", *overrides])


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def test_model_loss_equals_cross_entropy_and_export_hf_matches_load(tmp_path, monkeypatch):
    """loss="model" passes the targets as labels (no second shift): the same curve as cross_entropy on logits."""
    own = train(hf_config(tmp_path, "run.name=own", 'train.loss="model"'))
    ce = train(hf_config(tmp_path, "run.name=ce", 'train.loss="cross_entropy"'))
    runs = tmp_path / "runs"
    assert losses(runs / "own") == pytest.approx(losses(runs / "ce"), abs=1e-4)
    assert own["val_loss"] == pytest.approx(ce["val_loss"], abs=1e-4)
    resolved = (runs / "own" / "final" / "config.toml").read_text()
    assert 'name = "hf:gpt2"' in resolved and "vocab_size = " in resolved  # the data-derived HF config argument

    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the current directory first
    from turbotrain.cli import main

    assert main(["export", str(runs / "own"), "--format", "hf", "--out", str(tmp_path / "hfdir")]) == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hfdir").eval()
    ours = load(runs / "own", "cpu")
    assert not ours.training
    x = torch.randint(0, hf.config.vocab_size, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(input_ids=x).logits, rtol=0, atol=1e-6)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied weights stay tied

    # hf:/saved/dir builds the saved model with its weights
    again = build_model(ModelConfig(name=f"hf:{tmp_path / 'hfdir'}"))
    with torch.no_grad():
        torch.testing.assert_close(again(x), ours(x), rtol=0, atol=1e-6)


def test_blocks_are_found_and_activation_checkpointing_keeps_the_curve(tmp_path):
    model = build_model(ModelConfig(name="hf:gpt2", args={"n_layer": 3, "n_head": 2, "n_embd": 32, "vocab_size": 50}))
    assert find_blocks(model) is model.hf.transformer.h and len(find_blocks(model)) == 3
    plain = train(hf_config(tmp_path, "run.name=plain", "train.steps=2"))
    ckpt = train(hf_config(tmp_path, "run.name=ckpt", "train.steps=2", 'memory.activation_checkpointing="full"'))
    assert ckpt["final_loss"] == pytest.approx(plain["final_loss"], abs=1e-5)


def test_user_factory_hf_model_and_dict_rows_train(tmp_path):
    """A factory's bare GPT2LMHeadModel on HF-style dict rows (labels = input_ids, HF shifts them)."""
    cfg = hf_config(tmp_path, "run.name=rows", 'model.name="userpkg.hf_models:tiny_gpt2"', "model.args={}",
                    'data.name="userpkg.hf_models:dict_rows"', "data.args={}", 'train.loss="model"', "train.steps=3")
    summary = train(cfg)
    assert summary["steps"] == 3 and summary["final_loss"] == summary["final_loss"]
    model = load(tmp_path / "runs" / "rows", "cpu")
    assert type(model.hf).__name__ == "GPT2LMHeadModel"
    assert model.targets_are_inputs is None  # a fresh model decides on its first forward(x, y)


@pytest.mark.parametrize("overrides, words", [
    (['model.name="hf:nosuchtype"'], "knows no model type 'nosuchtype'"),
    (["model.args.n_layers=2"], "model.args.n_layers: not a field of GPT2Config"),
    (['model.name="hf:./missing-dir"'], "is not a saved HF model directory"),
    (['data.name="userpkg.hf_models:ambiguous_rows"', "data.args={}"], "its inputs keys are input_ids and inputs"),
])
def test_errors_are_one_line(tmp_path, overrides, words):
    with pytest.raises(UserError, match=words) as e:
        train(hf_config(tmp_path, *overrides))
    assert "\n" not in str(e.value)


def test_missing_transformers_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers → ImportError
    with pytest.raises(UserError, match=r"needs the Hugging Face transformers package: pip install 'turbotrain\[hf\]'"):
        build_model(ModelConfig(name="hf:gpt2"))


def torchrun(tmp_path: Path, *args: str) -> None:
    toml = tmp_path / "hf.toml"
    toml.write_text(TOML)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "turbotrain",
           "train", str(toml), f"run.out_dir={str(tmp_path / 'runs')!r}", "data.batch_size=4", *args]
    r = run_bounded(cmd, 240, "torchrun", env=userpkg_env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    path = tmp_path_factory.mktemp("one")
    train(hf_config(path, "run.name=one", 'train.loss="model"'))
    return path / "runs" / "one"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process_and_fsdp_exports_one_file(tmp_path, one_process, strategy):
    torchrun(tmp_path, f"parallel.strategy={strategy}", 'train.loss="model"', "run.name=dist",
             "checkpoint.every=2", *(["parallel.fsdp_units=\"blocks\""] if strategy == "fsdp" else []))
    dist = tmp_path / "runs" / "dist"
    assert losses(dist) == pytest.approx(losses(one_process), rel=1e-4)
    x = torch.randint(0, 60, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(load(dist, "cpu")(x), load(one_process, "cpu")(x), rtol=1e-4, atol=1e-4)
    if strategy == "fsdp":  # the sharded dcp/ checkpoint consolidates into the same single file
        from safetensors.torch import load_file

        final = load_file(dist / "final" / "model.safetensors")
        os.rename(dist / "final", dist / "final-kept")
        from turbotrain.export import export

        export(dist, "safetensors")
        again = load_file(dist / "export" / "safetensors" / "model.safetensors")
        assert final.keys() == again.keys() and all(torch.equal(final[k], again[k]) for k in final)


def test_dict_rows_passed_to_train_are_mapped_to_pairs(tmp_path):
    """train(train_data=rows of dicts) maps them as a config's data factory is mapped, and trains."""
    from userpkg.hf_models import dict_rows

    from turbotrain.data.datasets import map_dict_items

    rows = dict_rows("train", size=16)
    summary = train(hf_config(tmp_path, 'train.loss="model"', "train.steps=1"), train_data=rows)
    assert summary["steps"] == 1
    x, y = map_dict_items(rows)[3]
    assert x.dtype == torch.int64 and x.shape == (16,) and torch.equal(x, y)
    assert map_dict_items(rows).vocab_size == 64


def test_a_bare_hf_model_given_to_train_is_adapted(tmp_path):
    """train(model=<a transformers model>) wraps it as a factory's HF model is wrapped (adapt is idempotent)."""
    from userpkg.hf_models import tiny_gpt2

    from turbotrain.models import adapt

    summary = train(hf_config(tmp_path, "train.steps=1", 'train.loss="model"'), model=tiny_gpt2(vocab_size=100))
    assert summary["steps"] == 1
    summary = train(hf_config(tmp_path, "train.steps=1", 'train.loss="model"', "run.name=again"),
                    model=adapt(tiny_gpt2(vocab_size=100)))
    assert summary["steps"] == 1

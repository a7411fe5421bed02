"""The CLI end to end on the default preset (real Shakespeare text), on a CPU."""
import json
import subprocess
import sys

import pytest

FIELDS = ("step", "loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "step_ms", "data_wait_pct", "mfu",
          "peak_mem_gib")


def tt(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "turbotrain", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=900)


def rows(path):
    return [json.loads(line) for line in open(path / "metrics.jsonl")]


def test_default_preset_learns_within_60_steps(tmp_path):
    r = tt("train", "train.steps=60", "train.log_every=1", f"run.out_dir={str(tmp_path)!r}")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "gpt-shakespeare"
    assert (run / "config.toml").exists() and (run / "summary.json").exists()
    metrics = rows(run)
    assert [m["step"] for m in metrics] == list(range(1, 61))
    for m in metrics:
        assert set(FIELDS) <= set(m), set(FIELDS) - set(m)
        assert m["mfu"] is None  # no peak FLOP/s on a CPU
    first, last = metrics[0]["loss"], sum(m["loss"] for m in metrics[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    summary = json.loads((run / "summary.json").read_text())
    for key in ("final_loss", "val_loss", "tokens_per_s", "samples_per_s", "mfu", "peak_mem_gib", "compile_s",
                "wall_s"):
        assert key in summary
    assert summary["val_loss"] < first
    assert "step 60/60" in r.stdout


def test_accumulation_equals_big_batch_on_shakespeare(tmp_path):
    common = ["precision.dtype=fp32", "model.args.dropout=0.0", "train.steps=8", "train.log_every=1",
              f"run.out_dir={str(tmp_path)!r}"]
    assert tt("train", "run.name=big", "data.batch_size=16", "train.grad_accum=1", *common).returncode == 0
    assert tt("train", "run.name=acc", "data.batch_size=4", "train.grad_accum=4", *common).returncode == 0
    big, acc = [m["loss"] for m in rows(tmp_path / "big")], [m["loss"] for m in rows(tmp_path / "acc")]
    assert len(big) == 8 and big == pytest.approx(acc, rel=1e-4)


@pytest.mark.slow
def test_bf16_compile_trains_on_cpu(tmp_path):
    r = tt("train", "precision.dtype=bf16", "compile.enabled=true", "train.steps=5", "model.args.n_layer=1",
           "model.args.n_embd=32", "model.args.n_head=2", "data.args.block_size=32", "data.batch_size=8",
           f"run.out_dir={str(tmp_path)!r}")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "gpt-shakespeare" / "summary.json").read_text())
    assert summary["dtype"] == "bf16" and summary["compile_fell_back"] is False
    assert summary["compile_s"] > 0 and summary["graph_breaks"] == 0


def test_env_and_data_list():
    r = tt("env")
    assert r.returncode == 0 and "torch:" in r.stdout and "recommended:" in r.stdout
    r = tt("data", "list")
    assert r.returncode == 0 and "shakespeare" in r.stdout and "fashion_mnist" in r.stdout

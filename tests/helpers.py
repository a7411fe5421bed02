"""Shared builders for tests: tiny configs that run in a second on a CPU."""
from turbotrain.config import load_config

TINY_GPT = ["model.args.n_layer=2", "model.args.n_head=2", "model.args.n_embd=32", "model.args.block_size=32",
            "model.args.vocab_size=64", "model.args.dropout=0.0", "data.args.seq_len=32", "data.args.vocab_size=64",
            "data.args.size=256", "data.eval_batches=2", "precision.dtype=fp32", "compile.enabled=false"]


def tiny_gpt(tmp_path, *overrides):
    """gpt2-124m's wiring with a 2-layer, 32-wide model on synthetic tokens."""
    return load_config("gpt2-124m", [*TINY_GPT, f"run.out_dir={str(tmp_path)!r}", "train.log_every=1", *overrides])


def losses(tmp_path, name):
    import json

    rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
    return [r["loss"] for r in rows if "loss" in r]

"""The lead's cases of session 28: a kernel's bench variant named where the kernel resolves off says so in its row
(it would otherwise be a rerun of the baseline's other settings under the kernel's name)."""
import json
import subprocess
import sys

TINY = ["model.args.n_layer=1", "model.args.n_head=2", "model.args.n_embd=32", "model.args.vocab_size=64",
        "model.args.block_size=16", "data.args.vocab_size=64", "data.args.seq_len=16", "data.args.size=64",
        "data.batch_size=4", "data.eval_batches=0", "train.steps=3", "compile.enabled=false"]


def test_a_kernel_variant_that_resolved_off_says_so_in_its_verdict(tmp_path):
    r = subprocess.run([sys.executable, "-m", "turbotrain", "bench", "gpt2-124m", *TINY, "run.device=cpu",
                        f"run.out_dir={str(tmp_path)!r}", "--variants", "baseline,gelu_epilogue,packed_attn"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((tmp_path / "gpt2-124m-bench" / "bench.json").read_text())
    rows = {row["variant"]: row for row in result["rows"]}
    for variant, key in (("gelu_epilogue", "gelu_epilogue"), ("packed_attn", "packed_attention")):
        assert rows[variant]["verdict"].startswith(f"kernels.{key} resolved off on this run"), rows[variant]
    assert "resolved_off" not in rows["baseline"] and "resolved off" not in rows["baseline"]["verdict"]
    assert "resolved off on this run" in (tmp_path / "gpt2-124m-bench" / "bench.md").read_text()

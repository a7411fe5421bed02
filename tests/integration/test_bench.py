"""`turbotrain bench` on a CPU: rows, table and chart; comparators skipped with a note when absent."""
import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_bench_three_variants(tmp_path):
    r = subprocess.run([sys.executable, "-m", "turbotrain", "bench", "gpt-shakespeare", "train.steps=20",
                        f"run.out_dir={str(tmp_path)!r}", "--variants", "baseline,bf16,accum",
                        "--compare", "accelerate"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "gpt-shakespeare-bench"
    result = json.loads((out / "bench.json").read_text())
    rows = {row["variant"]: row for row in result["rows"]}
    for v in ("baseline", "bf16", "accum"):
        row = rows[v]
        assert row["tokens_per_s"] > 0 and row["peak_mem_gib"] > 0 and row["final_loss"] > 0
        assert "speedup" in row and row["val_loss"] is not None
    assert rows["baseline"]["speedup"] == 1.0
    assert rows["bf16"]["dtype"] == "bf16"
    # same global batch through micro-batches: the same training curve end point
    assert rows["accum"]["final_loss"] == pytest.approx(rows["baseline"]["final_loss"], rel=1e-4)
    assert rows["accum"]["val_loss"] == pytest.approx(rows["baseline"]["val_loss"], rel=1e-4)
    md = (out / "bench.md").read_text()
    assert "| baseline |" in md and "| accum |" in md
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    comparator = [row for row in result["rows"] if row["variant"].startswith("accelerate")][0]
    assert "skipped" in comparator or comparator.get("samples_per_s")


def test_unknown_variant_is_a_user_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "turbotrain", "bench", f"run.out_dir={str(tmp_path)!r}",
                        "--variants", "baseline,warp"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error: --variants: unknown variant 'warp'")

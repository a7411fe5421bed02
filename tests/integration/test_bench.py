"""`turbotrain bench` on a CPU: rows, table and chart; a comparator where it is installed."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_bench_three_variants(tmp_path):
    """A comparator runs where it is installed (an absent one is refused before anything runs: test_commands_
    redteam.py)."""
    compare = ["--compare", "accelerate"] if importlib.util.find_spec("accelerate") else []
    r = subprocess.run([sys.executable, "-m", "turbotrain", "bench", "gpt-shakespeare", "train.steps=20",
                        "data.eval_batches=2", "model.args.n_layer=2", "model.args.n_embd=64", "data.batch_size=16",
                        f"run.out_dir={str(tmp_path)!r}", "--variants", "baseline,bf16,accum", *compare],
                       capture_output=True, text=True, timeout=900)
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
    if compare:
        comparator = [row for row in result["rows"] if row["variant"].startswith("accelerate")][0]
        assert "skipped" in comparator or comparator.get("samples_per_s")


def test_unknown_variant_is_a_user_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "turbotrain", "bench", f"run.out_dir={str(tmp_path)!r}",
                        "--variants", "baseline,warp"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error: --variants: unknown variant 'warp'")


def _rows(kind: str, deltas: list[tuple[str, float, float]]) -> list[dict]:
    """bench rows: (variant, val loss, val acc) after a baseline at loss 1.0 / accuracy 0.90."""
    tok = 1000.0 if kind == "lm" else None
    rows = [{"variant": "baseline", "samples_per_s": 10.0, "tokens_per_s": tok, "peak_mem_gib": 1.0,
             "val_loss": 1.0, "val_acc": 0.90}]
    for v, loss, acc in deltas:
        rows.append({"variant": v, "samples_per_s": 10.0, "tokens_per_s": tok, "peak_mem_gib": 1.0,
                     "val_loss": loss, "val_acc": acc})
    return rows


def test_converge_parity_follows_the_workloads_criterion():
    from turbotrain.bench import _judge

    lm = _rows("lm", [("bf16", 1.02, 0.90), ("tf32", 1.005, 0.85)])
    _judge(lm, converge=True)  # language model: val loss within 1 %; accuracy does not decide
    assert lm[1]["verdict"].endswith("parity missed") and "val loss +2.0%" in lm[1]["verdict"]
    assert lm[2]["verdict"] == "parity held"
    cls = _rows("classifier", [("bf16", 1.03, 0.898), ("fp16", 1.0, 0.895)])
    _judge(cls, converge=True)  # classifier: accuracy within 0.3 pt; its val loss does not decide
    assert cls[1]["verdict"] == "parity held" and cls[1]["val_loss_delta"] == pytest.approx(0.03)
    assert cls[2]["verdict"].endswith("parity missed") and "-0.50 pt" in cls[2]["verdict"]
    quick = _rows("classifier", [("bf16", 1.06, 0.90)])
    _judge(quick, converge=False)  # a plain bench flags a val loss 5 % worse whatever the workload
    assert "hurts convergence" in quick[1]["verdict"]
    synthetic = _rows("classifier", [("accum", 1.06, 0.90)])
    _judge(synthetic, converge=False, synthetic=True)  # random labels: the loss says nothing
    assert synthetic[1]["verdict"] == "ok"


def test_a_comparator_that_fails_is_a_row_with_its_error_and_the_bench_completes(tmp_path):
    """An installed peer runs benchmarks/peers.py as a script; one that cannot run (here a stand-in package
    without Accelerator) leaves an error row, the rows already measured and bench.json intact."""
    fake = tmp_path / "site" / "accelerate"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "turbotrain", "bench", "gpt-shakespeare", "train.steps=3",
                        "model.args.n_layer=1", "model.args.n_embd=32", "model.args.n_head=2", "data.batch_size=4",
                        "data.args.block_size=16", "data.eval_batches=1", f"run.out_dir={str(tmp_path)!r}",
                        "--variants", "baseline", "--compare", "accelerate"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "gpt-shakespeare-bench" / "bench.json").read_text())["rows"]
    assert rows[0]["variant"] == "baseline" and rows[0]["samples_per_s"] > 0
    peer = [row for row in rows if row["variant"].startswith("accelerate")]
    assert len(peer) == 1 and "Accelerator" in json.dumps(peer[0]), peer
